//! The UDP socket under a QUIC endpoint, with segmentation offload batches
//! kept within what the kernel sends.

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

/// Largest UDP payload the kernel takes in one send, a segmentation-offload
/// batch included.
const MAX_SEND: usize = 65_507;

/// A socket that sends a segmentation-offload batch over [`MAX_SEND`] bytes
/// as several. quinn batches up to 10 datagrams of the path's size: with
/// jumbo frames that is 89 KB, which the kernel refuses (`EMSGSIZE`), and
/// quinn takes the refusal for loss, so bulk transfers stall.
#[derive(Debug)]
pub(crate) struct SplitSocket {
    inner: Arc<dyn AsyncUdpSocket>,
}

impl SplitSocket {
    /// Wraps `inner`.
    pub(crate) fn new(inner: Arc<dyn AsyncUdpSocket>) -> SplitSocket {
        SplitSocket { inner }
    }
}

impl AsyncUdpSocket for SplitSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        let segment = match transmit.segment_size {
            Some(s) if transmit.contents.len() > MAX_SEND && s > 0 => s,
            _ => return self.inner.try_send(transmit),
        };
        // Whole datagrams per send. A send that would block after others went
        // makes quinn retry the whole batch: the datagrams already sent arrive
        // twice, which QUIC discards by packet number.
        let per_send = (MAX_SEND / segment).max(1) * segment;
        for part in transmit.contents.chunks(per_send) {
            self.inner.try_send(&Transmit {
                destination: transmit.destination,
                ecn: transmit.ecn,
                contents: part,
                segment_size: (part.len() > segment).then_some(segment),
                src_ip: transmit.src_ip,
            })?;
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of jumbo datagrams larger than one send arrives whole, each datagram once.
    #[test]
    fn a_batch_over_one_send_arrives_as_its_datagrams() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let runtime = quinn::default_runtime().unwrap();
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let tx = runtime
            .wrap_udp_socket(std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
            .unwrap();
        if tx.max_transmit_segments() < 10 {
            eprintln!("no segmentation offload here: nothing to split");
            return;
        }
        let tx = SplitSocket::new(tx);
        let segment = usize::from(crate::tls::JUMBO_UDP_PAYLOAD);
        let contents: Vec<u8> = (0..10 * segment).map(|i| (i / segment) as u8).collect();
        let tx = Arc::new(tx);
        let mut poller = tx.clone().create_io_poller();
        let transmit = Transmit {
            destination: rx.local_addr().unwrap(),
            ecn: None,
            contents: &contents,
            segment_size: Some(segment),
            src_ip: None,
        };
        // A fresh socket is writable once tokio has polled it.
        for _ in 0..100 {
            rt.block_on(std::future::poll_fn(|cx| poller.as_mut().poll_writable(cx)))
                .unwrap();
            match tx.try_send(&transmit) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                sent => {
                    sent.unwrap();
                    break;
                }
            }
        }
        let mut buf = vec![0u8; 65_536];
        for k in 0..10u8 {
            let n = rx.recv(&mut buf).unwrap();
            assert_eq!(n, segment, "datagram {k}");
            assert!(buf[..n].iter().all(|&b| b == k), "datagram {k}");
        }
    }
}
