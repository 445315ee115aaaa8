//! The wire format.
//!
//! A frame is a 4-byte little-endian length followed by a bincode-encoded
//! [`Frame`]: a request ([`Envelope`]), a reply, or a heartbeat. The length is
//! checked against the stream's limit before any buffer is sized for it, and
//! bincode decodes under the same limit, so a peer cannot make a receiver
//! allocate more than a frame. Small frames share one ordered stream per
//! connection direction; frames over [`SMALL_FRAME`] travel on a stream of
//! their own (limit [`MAX_LARGE_FRAME`]) so small messages are not stuck
//! behind them. Payload bytes are encoded as one block (serde bytes), and
//! tensors as [`TensorPayload`]: dtype, shape and raw little-endian bytes,
//! checked for consistency and size on decode.

use serde::{Deserialize, Serialize};

/// Largest frame accepted on the shared small-message stream (16 MiB).
pub const MAX_FRAME: usize = 16 << 20;
/// Frames above this size (256 KiB) are sent on a stream of their own.
pub const SMALL_FRAME: usize = 256 << 10;
/// Largest tensor accepted (1 GiB); bigger data is split by the application.
pub const MAX_TENSOR_BYTES: u64 = 1 << 30;
/// Largest frame accepted on a stream of its own: a maximal tensor plus headers.
pub const MAX_LARGE_FRAME: usize = (MAX_TENSOR_BYTES as usize) + (1 << 20);
/// Most dimensions a tensor may have.
pub const MAX_DIMS: usize = 8;
/// Longest actor name or message kind.
pub const MAX_NAME: usize = 256;

type Limited<const N: usize> = bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<N>,
>;
const SMALL: Limited<MAX_FRAME> = bincode::config::standard().with_limit::<MAX_FRAME>();
const LARGE: Limited<MAX_LARGE_FRAME> = bincode::config::standard().with_limit::<MAX_LARGE_FRAME>();

/// Errors decoding or encoding wire data; any of them closes the stream it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A frame announces more bytes than its stream allows.
    #[error("frame of {got} bytes exceeds the {limit}-byte limit")]
    FrameTooLarge {
        /// Announced size.
        got: usize,
        /// The limit.
        limit: usize,
    },
    /// The frame's bytes are not a valid frame.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// A tensor payload is inconsistent or too large.
    #[error("bad tensor payload: {0}")]
    BadTensor(String),
    /// An actor name is not allowed.
    #[error("bad actor name {0:?}: 1-{MAX_NAME} characters of [a-z0-9_./-]")]
    BadName(String),
}

/// An actor's address: `sampler/2`, `features/author/1`, `reducer`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(into = "String")]
pub struct ActorName(String);

impl<'de> Deserialize<'de> for ActorName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ActorName, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = ActorName;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an actor name")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ActorName, E> {
                ActorName::new(v).map_err(E::custom)
            }
        }
        // Borrowed, as in `borrowed_str`.
        d.deserialize_str(Name)
    }
}

/// Strings decoded from the received bytes in place, then copied: bincode
/// allocates an owned `String` at its declared length before checking that
/// the bytes are there, so a few bytes declaring a long string would cost up
/// to the whole frame limit; a borrowed one is checked against the input first.
mod borrowed_str {
    use serde::de::{Error, Visitor};

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        d.deserialize_str(Owned)
    }

    struct Owned;

    impl Visitor<'_> for Owned {
        type Value = String;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string")
        }

        fn visit_str<E: Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_owned())
        }
    }
}

impl ActorName {
    /// Validates `name`.
    pub fn new(name: &str) -> Result<ActorName, WireError> {
        let ok = !name.is_empty()
            && name.len() <= MAX_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_./-".contains(&b));
        if ok {
            Ok(ActorName(name.to_string()))
        } else {
            Err(WireError::BadName(name.chars().take(64).collect()))
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ActorName {
    type Error = WireError;
    fn try_from(s: String) -> Result<Self, WireError> {
        ActorName::new(&s)
    }
}

impl From<ActorName> for String {
    fn from(n: ActorName) -> String {
        n.0
    }
}

impl std::fmt::Display for ActorName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A message id, unique per sending node: retries reuse it, so receivers can drop duplicates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MsgId {
    /// The sending node's index in the topology (clients: a hash of their name with the top bit set).
    pub node: u32,
    /// Sequence number on that node; it starts from the clock at node start, so a
    /// restarted node does not reuse the ids of its previous life.
    pub seq: u64,
}

/// A request to an actor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// Destination actor.
    pub to: ActorName,
    /// Sending actor.
    pub from: ActorName,
    /// Id for duplicate suppression.
    pub msg_id: MsgId,
    /// Message kind (names the handler and the metrics row), e.g. `feature_pull`.
    pub kind: ActorName,
    /// Milliseconds the sender will wait for the reply (0 = no deadline).
    pub ttl_ms: u64,
    /// The bincode-encoded message.
    #[serde(with = "owned_bytes")]
    pub payload: Vec<u8>,
}

/// Why a request was not handled, as told to the requester.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RemoteError {
    /// No actor of that name runs on the receiving node.
    #[error("no actor {0} on that node")]
    NoSuchActor(#[serde(deserialize_with = "borrowed_str::deserialize")] String),
    /// The actor does not handle that kind of message.
    #[error("actor {actor} does not handle {kind} messages")]
    NoHandler {
        /// The actor.
        #[serde(deserialize_with = "borrowed_str::deserialize")]
        actor: String,
        /// The message kind.
        #[serde(deserialize_with = "borrowed_str::deserialize")]
        kind: String,
    },
    /// The message bytes did not decode as the handler's type.
    #[error("undecodable message: {0}")]
    BadMessage(#[serde(deserialize_with = "borrowed_str::deserialize")] String),
    /// The actor stopped before replying.
    #[error("actor {0} stopped")]
    Stopped(#[serde(deserialize_with = "borrowed_str::deserialize")] String),
}

/// One unit on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Frame {
    /// A message for an actor; every request is answered by a [`Frame::Reply`].
    Request(Envelope),
    /// The answer to request `id`: the bincode-encoded reply or why there is none.
    Reply {
        /// The request answered.
        id: MsgId,
        /// Encoded reply, or the error.
        result: Result<ByteVec, RemoteError>,
    },
    /// Liveness signal for the failure detector.
    Heartbeat {
        /// Sender's clock, microseconds since its start (for diagnostics).
        sent_us: u64,
    },
    /// From an asker whose reply is late: is request `id` known? Sent on the
    /// ordered stream after the request, so it never overtakes it.
    Probe {
        /// The request asked about.
        id: MsgId,
    },
    /// The answer to a [`Frame::Probe`] for a request never received: send it again.
    Unheard {
        /// The request asked about.
        id: MsgId,
    },
}

/// Bytes encoded as one block rather than element by element.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ByteVec(#[serde(with = "owned_bytes")] pub Vec<u8>);

/// A block of bytes that [`decode_msg_shared`] hands out as a view of the
/// received buffer, not a copy (elsewhere it decodes as a copy): the rows a
/// feature store sends reach the trainer without another pass over them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharedBytes(pub bytes::Bytes);

impl Serialize for SharedBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for SharedBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<SharedBytes, D::Error> {
        struct Shared;
        impl<'de> serde::de::Visitor<'de> for Shared {
            type Value = SharedBytes;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_borrowed_bytes<E: serde::de::Error>(
                self,
                v: &'de [u8],
            ) -> Result<SharedBytes, E> {
                Ok(SharedBytes(SOURCE.with(|s| match s.borrow().as_ref() {
                    Some(src) if within(src, v) => src.slice_ref(v),
                    _ => bytes::Bytes::copy_from_slice(v),
                })))
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<SharedBytes, E> {
                Ok(SharedBytes(bytes::Bytes::copy_from_slice(v)))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<SharedBytes, E> {
                Ok(SharedBytes(v.into()))
            }
        }
        d.deserialize_bytes(Shared)
    }
}

thread_local! {
    /// The buffer [`decode_msg_shared`] is decoding on this thread, if any.
    static SOURCE: std::cell::RefCell<Option<bytes::Bytes>> = const { std::cell::RefCell::new(None) };
}

/// Whether `v` lies inside `src` (then `slice_ref` takes it without a copy).
fn within(src: &bytes::Bytes, v: &[u8]) -> bool {
    let (a, b) = (src.as_ptr() as usize, v.as_ptr() as usize);
    !v.is_empty() && b >= a && b + v.len() <= a + src.len()
}

/// [`decode_msg`], with every [`SharedBytes`] in `T` a view of `bytes`.
pub fn decode_msg_shared<T: serde::de::DeserializeOwned>(
    bytes: &bytes::Bytes,
) -> Result<T, WireError> {
    /// Puts back what was there before, however decoding ends.
    struct Restore(Option<bytes::Bytes>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let before = self.0.take();
            SOURCE.with(|s| *s.borrow_mut() = before);
        }
    }
    let _restore = Restore(SOURCE.with(|s| s.borrow_mut().replace(bytes.clone())));
    decode_msg(bytes)
}

/// Byte blocks as serde bytes, decoded into an owned vector by one copy of the
/// borrowed input: bincode's own `Vec<u8>` decoding zero-fills the vector
/// before copying into it, a wasted pass over every tensor received.
mod owned_bytes {
    use serde::de::{Error, SeqAccess, Visitor};

    pub fn serialize<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(bytes)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        d.deserialize_bytes(Owned)
    }

    struct Owned;

    impl<'de> Visitor<'de> for Owned {
        type Value = Vec<u8>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("bytes")
        }

        fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }

        fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            // Self-describing formats without a bytes type (bincode never comes here);
            // the hint is capped so a lying length cannot allocate.
            let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
            while let Some(b) = seq.next_element()? {
                v.push(b);
            }
            Ok(v)
        }
    }
}

/// Encodes `frame` (length prefix included), refusing frames over [`MAX_LARGE_FRAME`].
pub fn encode_frame(frame: &Frame) -> Result<Vec<u8>, WireError> {
    let mut out = vec![0u8; 4];
    bincode::serde::encode_into_std_write(frame, &mut out, LARGE)
        .map_err(|e| WireError::Malformed(e.to_string()))?;
    let len = out.len() - 4;
    if len > MAX_LARGE_FRAME {
        return Err(WireError::FrameTooLarge {
            got: len,
            limit: MAX_LARGE_FRAME,
        });
    }
    out[..4].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(out)
}

/// Encodes the head of a request frame whose payload (`payload_len` bytes,
/// not in `env`) is sent right after it, uncopied: head followed by the
/// payload equals `encode_frame(&Frame::Request(env_with_payload))`.
pub fn encode_request_head(env: &Envelope, payload_len: usize) -> Result<Vec<u8>, WireError> {
    if !env.payload.is_empty() {
        return Err(WireError::Malformed(
            "encode_request_head takes an envelope without payload".into(),
        ));
    }
    head_of(&Frame::Request(env.clone()), payload_len)
}

/// Encodes the head of a successful reply whose `reply_len` bytes are sent right
/// after it, uncopied: head followed by the bytes equals
/// `encode_frame(&Frame::Reply { id, result: Ok(ByteVec(bytes)) })`.
pub fn encode_reply_head(id: MsgId, reply_len: usize) -> Result<Vec<u8>, WireError> {
    head_of(
        &Frame::Reply {
            id,
            result: Ok(ByteVec::default()),
        },
        reply_len,
    )
}

/// `frame` ends with an empty byte block; its encoding without that block's
/// bytes, announcing `len` of them.
fn head_of(frame: &Frame, len: usize) -> Result<Vec<u8>, WireError> {
    let mut head = encode_frame(frame)?;
    // The frame ends with its byte block: a varint length (0 here), then the bytes.
    if head.pop() != Some(0) {
        return Err(WireError::Malformed("unexpected frame encoding".into()));
    }
    let n = len as u64;
    if n < 251 {
        head.push(n as u8);
    } else if n <= u16::MAX as u64 {
        head.push(251);
        head.extend_from_slice(&(n as u16).to_le_bytes());
    } else if n <= u32::MAX as u64 {
        head.push(252);
        head.extend_from_slice(&(n as u32).to_le_bytes());
    } else {
        head.push(253);
        head.extend_from_slice(&n.to_le_bytes());
    }
    let total = head.len() - 4 + len;
    if total > MAX_LARGE_FRAME {
        return Err(WireError::FrameTooLarge {
            got: total,
            limit: MAX_LARGE_FRAME,
        });
    }
    head[..4].copy_from_slice(&(total as u32).to_le_bytes());
    Ok(head)
}

/// A byte block borrowed from the received frame.
#[derive(Debug, Deserialize)]
#[serde(transparent)]
pub struct BorrowedBytes<'a>(#[serde(borrow, with = "serde_bytes")] pub &'a [u8]);

/// A request decoded in place: the payload borrows the received bytes.
#[derive(Debug, Deserialize)]
pub struct EnvelopeRef<'a> {
    /// Destination actor.
    pub to: ActorName,
    /// Sending actor.
    pub from: ActorName,
    /// Id for duplicate suppression.
    pub msg_id: MsgId,
    /// Message kind.
    pub kind: ActorName,
    /// Milliseconds the sender will wait.
    pub ttl_ms: u64,
    /// The encoded message, borrowed.
    #[serde(borrow, with = "serde_bytes")]
    pub payload: &'a [u8],
}

/// [`Frame`] decoded in place (same encoding), for large frames whose payload should not be copied.
#[derive(Debug, Deserialize)]
pub enum FrameRef<'a> {
    /// See [`Frame::Request`].
    Request(#[serde(borrow)] EnvelopeRef<'a>),
    /// See [`Frame::Reply`].
    Reply {
        /// The request answered.
        id: MsgId,
        /// Encoded reply, borrowed, or the error.
        #[serde(borrow)]
        result: Result<BorrowedBytes<'a>, RemoteError>,
    },
    /// See [`Frame::Heartbeat`].
    Heartbeat {
        /// Sender's clock.
        sent_us: u64,
    },
    /// See [`Frame::Probe`].
    Probe {
        /// The request asked about.
        id: MsgId,
    },
    /// See [`Frame::Unheard`].
    Unheard {
        /// The request asked about.
        id: MsgId,
    },
}

/// Decodes a whole frame body (without its length prefix) received on a stream
/// of its own, in place: a request's payload or a reply's bytes borrow `body`.
pub fn decode_large_ref(body: &[u8]) -> Result<FrameRef<'_>, WireError> {
    if body.len() > MAX_LARGE_FRAME {
        return Err(WireError::FrameTooLarge {
            got: body.len(),
            limit: MAX_LARGE_FRAME,
        });
    }
    let (frame, used): (FrameRef<'_>, usize) =
        bincode::serde::borrow_decode_from_slice(body, LARGE)
            .map_err(|e| WireError::Malformed(e.to_string()))?;
    if used != body.len() {
        return Err(WireError::Malformed(format!(
            "{} trailing bytes in frame",
            body.len() - used
        )));
    }
    Ok(frame)
}

impl FrameRef<'_> {
    /// The owned frame (copies a request's payload or a reply's bytes).
    pub fn into_owned(self) -> Frame {
        match self {
            FrameRef::Request(r) => Frame::Request(Envelope {
                to: r.to,
                from: r.from,
                msg_id: r.msg_id,
                kind: r.kind,
                ttl_ms: r.ttl_ms,
                payload: r.payload.to_vec(),
            }),
            FrameRef::Reply { id, result } => Frame::Reply {
                id,
                result: result.map(|b| ByteVec(b.0.to_vec())),
            },
            FrameRef::Heartbeat { sent_us } => Frame::Heartbeat { sent_us },
            FrameRef::Probe { id } => Frame::Probe { id },
            FrameRef::Unheard { id } => Frame::Unheard { id },
        }
    }
}

/// Encodes a message body.
pub fn encode_msg<T: Serialize>(value: &T) -> Result<Vec<u8>, WireError> {
    bincode::serde::encode_to_vec(value, LARGE).map_err(|e| WireError::Malformed(e.to_string()))
}

/// Decodes a message body, refusing trailing bytes.
///
/// bincode sizes an owned `String` or `Vec<u8>` at its declared length
/// before it checks that the bytes are there; only its limit bounds that
/// buffer. So the limit follows the body's size: at least 32 times it (what
/// bincode counts against the limit while decoding through serde is at most
/// 16 bytes per byte read, for a one-byte varint of a `u128`, and twice the
/// length of a string), in steps of 16, from 1 MiB. A few bytes declaring a
/// gigabyte-long error string then cost at most 1 MiB, not the frame limit.
pub fn decode_msg<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    fn limited<T: serde::de::DeserializeOwned, const N: usize>(
        bytes: &[u8],
    ) -> Result<(T, usize), bincode::error::DecodeError> {
        bincode::serde::decode_from_slice(bytes, bincode::config::standard().with_limit::<N>())
    }
    let decoded = match bytes.len() {
        n if n <= 32 << 10 => limited::<T, { 1 << 20 }>(bytes),
        n if n <= 512 << 10 => limited::<T, { 16 << 20 }>(bytes),
        n if n <= 8 << 20 => limited::<T, { 256 << 20 }>(bytes),
        _ => bincode::serde::decode_from_slice(bytes, LARGE),
    };
    let (v, used): (T, usize) = decoded.map_err(|e| WireError::Malformed(e.to_string()))?;
    if used != bytes.len() {
        return Err(WireError::Malformed(format!(
            "{} trailing bytes in message",
            bytes.len() - used
        )));
    }
    Ok(v)
}

/// Splits the shared small-message stream into frames; feed it whatever arrives.
#[derive(Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    start: usize,
    last: usize,
}

impl FrameDecoder {
    /// An empty decoder.
    pub fn new() -> FrameDecoder {
        FrameDecoder::default()
    }

    /// Appends received bytes; refuses to hold more than one maximal frame
    /// plus `bytes` undecoded (the caller drains with [`FrameDecoder::next_frame`]).
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        if self.pending() > 4 + MAX_FRAME {
            return Err(WireError::FrameTooLarge {
                got: self.pending(),
                limit: MAX_FRAME,
            });
        }
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed, or an
    /// error (after which the stream must be closed).
    pub fn next_frame(&mut self) -> Result<Option<Frame>, WireError> {
        let buf = &self.buf[self.start..];
        if buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len > MAX_FRAME {
            return Err(WireError::FrameTooLarge {
                got: len,
                limit: MAX_FRAME,
            });
        }
        if buf.len() < 4 + len {
            return Ok(None);
        }
        let (frame, used): (Frame, usize) =
            bincode::serde::decode_from_slice(&buf[4..4 + len], SMALL)
                .map_err(|e| WireError::Malformed(e.to_string()))?;
        if used != len {
            return Err(WireError::Malformed(format!(
                "{} trailing bytes in frame",
                len - used
            )));
        }
        self.start += 4 + len;
        self.last = 4 + len;
        Ok(Some(frame))
    }

    /// Size of the last frame returned, length prefix included.
    pub fn last_frame_len(&self) -> usize {
        self.last
    }

    /// Bytes received but not yet decoded.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }
}

/// Element types of tensors on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireDType {
    /// float32
    F32 = 0,
    /// int64
    I64 = 1,
    /// uint32
    U32 = 2,
}

impl WireDType {
    fn size(self) -> u64 {
        match self {
            WireDType::F32 | WireDType::U32 => 4,
            WireDType::I64 => 8,
        }
    }
    fn from_code(c: u8) -> Option<WireDType> {
        match c {
            0 => Some(WireDType::F32),
            1 => Some(WireDType::I64),
            2 => Some(WireDType::U32),
            _ => None,
        }
    }
}

/// A tensor as raw little-endian bytes with its dtype and shape. Inside
/// messages it serializes as one block of bytes and is validated on decode.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawTensor")]
pub struct TensorPayload {
    /// Element type.
    pub dtype: WireDType,
    /// Shape.
    pub shape: Vec<u64>,
    /// `product(shape) · size(dtype)` little-endian bytes.
    pub data: Vec<u8>,
}

#[derive(Deserialize)]
struct RawTensor(
    u8,
    #[serde(deserialize_with = "dims")] Vec<u64>,
    #[serde(with = "owned_bytes")] Vec<u8>,
);

/// A tensor's shape, refused past [`MAX_DIMS`] as it is read: the declared
/// count is no reason to allocate, nor are a million one-byte dimensions.
fn dims<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
    struct Dims;
    impl<'de> serde::de::Visitor<'de> for Dims {
        type Value = Vec<u64>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "at most {MAX_DIMS} dimensions")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u64>, A::Error> {
            let mut shape = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX_DIMS));
            while let Some(d) = seq.next_element()? {
                if shape.len() == MAX_DIMS {
                    return Err(serde::de::Error::custom(WireError::BadTensor(format!(
                        "more than {MAX_DIMS} dimensions"
                    ))));
                }
                shape.push(d);
            }
            Ok(shape)
        }
    }
    d.deserialize_seq(Dims)
}

/// [`RawTensor`]'s encoding, borrowed: `serde(into)` would clone the bytes first.
#[derive(Serialize)]
struct RawTensorRef<'a>(u8, &'a [u64], #[serde(with = "serde_bytes")] &'a [u8]);

impl Serialize for TensorPayload {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RawTensorRef(self.dtype as u8, &self.shape, &self.data).serialize(s)
    }
}

impl TryFrom<RawTensor> for TensorPayload {
    type Error = WireError;
    fn try_from(r: RawTensor) -> Result<TensorPayload, WireError> {
        let dtype = WireDType::from_code(r.0)
            .ok_or_else(|| WireError::BadTensor(format!("unknown dtype code {}", r.0)))?;
        let t = TensorPayload {
            dtype,
            shape: r.1,
            data: r.2,
        };
        t.check()?;
        Ok(t)
    }
}

impl TensorPayload {
    /// Raw bytes of the given dtype and shape (validated).
    pub fn new(dtype: WireDType, shape: &[u64], data: Vec<u8>) -> Result<TensorPayload, WireError> {
        let t = TensorPayload {
            dtype,
            shape: shape.to_vec(),
            data,
        };
        t.check()?;
        Ok(t)
    }

    /// A float32 tensor.
    pub fn from_f32(shape: &[u64], values: &[f32]) -> Result<TensorPayload, WireError> {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = TensorPayload {
            dtype: WireDType::F32,
            shape: shape.to_vec(),
            data,
        };
        t.check()?;
        Ok(t)
    }

    /// The values of a float32 tensor.
    pub fn to_f32(&self) -> Result<Vec<f32>, WireError> {
        if self.dtype != WireDType::F32 {
            return Err(WireError::BadTensor(format!(
                "{:?} where f32 was expected",
                self.dtype
            )));
        }
        Ok(self
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    fn byte_len(dtype: WireDType, shape: &[u64]) -> Result<u64, WireError> {
        if shape.len() > MAX_DIMS {
            return Err(WireError::BadTensor(format!(
                "{} dimensions (limit {MAX_DIMS})",
                shape.len()
            )));
        }
        let bytes = shape
            .iter()
            .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| WireError::BadTensor(format!("shape {shape:?} overflows")))?;
        if bytes > MAX_TENSOR_BYTES {
            return Err(WireError::BadTensor(format!(
                "{bytes} bytes exceeds the {MAX_TENSOR_BYTES}-byte limit"
            )));
        }
        Ok(bytes)
    }

    fn check(&self) -> Result<(), WireError> {
        let want = Self::byte_len(self.dtype, &self.shape)?;
        if want != self.data.len() as u64 {
            return Err(WireError::BadTensor(format!(
                "shape {:?} needs {want} bytes, got {}",
                self.shape,
                self.data.len()
            )));
        }
        Ok(())
    }

    /// Encodes as `dtype (1) | ndims (1) | dims (8 each) | data`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(2 + 8 * self.shape.len() + self.data.len());
        out.push(self.dtype as u8);
        out.push(self.shape.len() as u8);
        for d in &self.shape {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&self.data);
        out
    }

    /// Decodes and validates; the data size is checked before it is copied.
    pub fn decode(bytes: &[u8]) -> Result<TensorPayload, WireError> {
        let short = || WireError::BadTensor("truncated header".into());
        let (&code, rest) = bytes.split_first().ok_or_else(short)?;
        let dtype = WireDType::from_code(code)
            .ok_or_else(|| WireError::BadTensor(format!("unknown dtype code {code}")))?;
        let (&ndims, mut rest) = rest.split_first().ok_or_else(short)?;
        if ndims as usize > MAX_DIMS {
            return Err(WireError::BadTensor(format!(
                "{ndims} dimensions (limit {MAX_DIMS})"
            )));
        }
        let mut shape = Vec::with_capacity(ndims as usize);
        for _ in 0..ndims {
            if rest.len() < 8 {
                return Err(short());
            }
            let (d, r) = rest.split_at(8);
            shape.push(u64::from_le_bytes(d.try_into().expect("8 bytes")));
            rest = r;
        }
        let want = Self::byte_len(dtype, &shape)?;
        if rest.len() as u64 != want {
            return Err(WireError::BadTensor(format!(
                "shape {shape:?} needs {want} bytes, got {}",
                rest.len()
            )));
        }
        Ok(TensorPayload {
            dtype,
            shape,
            data: rest.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_bytes_decode_as_views_of_the_received_buffer_and_as_copies_elsewhere() {
        let reply: Result<Option<SharedBytes>, String> = Ok(Some(SharedBytes(bytes::Bytes::from(
            (0..1000u32).map(|i| i as u8).collect::<Vec<_>>(),
        ))));
        let wire = bytes::Bytes::from(encode_msg(&reply).unwrap());
        let shared: Result<Option<SharedBytes>, String> = decode_msg_shared(&wire).unwrap();
        assert_eq!(shared, reply);
        let view = shared.unwrap().unwrap().0;
        let inside = view.as_ptr() as usize - wire.as_ptr() as usize;
        assert!(inside < wire.len(), "a view of the received bytes");
        // Plain decoding copies, and leaves nothing behind for the next message.
        let copied: Result<Option<SharedBytes>, String> = decode_msg(&wire).unwrap();
        let c = copied.unwrap().unwrap().0;
        assert_eq!(c, view);
        assert!((c.as_ptr() as usize).wrapping_sub(wire.as_ptr() as usize) >= wire.len());
        // Truncated or lying input is refused as before.
        assert!(decode_msg_shared::<Result<Option<SharedBytes>, String>>(
            &wire.slice(..wire.len() - 1)
        )
        .is_err());
        assert!(decode_msg_shared::<Result<Option<SharedBytes>, String>>(
            &bytes::Bytes::from_static(&[0, 1, 0xfc, 0xff, 0xff, 0xff, 0x7f, 1])
        )
        .is_err());
    }

    fn req(payload: Vec<u8>) -> Frame {
        Frame::Request(Envelope {
            to: ActorName::new("features/author/1").unwrap(),
            from: ActorName::new("trainer/0").unwrap(),
            msg_id: MsgId { node: 2, seq: 77 },
            kind: ActorName::new("feature_pull").unwrap(),
            ttl_ms: 1234,
            payload,
        })
    }

    #[test]
    fn frames_round_trip_across_arbitrary_splits() {
        let a = req(vec![1, 2, 3]);
        let b = req(vec![9; 1000]);
        let c = Frame::Reply {
            id: MsgId { node: 1, seq: 5 },
            result: Err(RemoteError::NoSuchActor("x".into())),
        };
        let d = Frame::Heartbeat { sent_us: 99 };
        let mut bytes = Vec::new();
        for f in [&a, &b, &c, &d] {
            bytes.extend(encode_frame(f).unwrap());
        }
        for split in [1, 3, 4, 5, 17, bytes.len() - 1] {
            let mut dec = FrameDecoder::new();
            let mut got = Vec::new();
            for chunk in bytes.chunks(split) {
                dec.push(chunk).unwrap();
                while let Some(e) = dec.next_frame().unwrap() {
                    got.push(e);
                }
            }
            assert_eq!(
                got,
                vec![a.clone(), b.clone(), c.clone(), d.clone()],
                "split {split}"
            );
            assert_eq!(dec.pending(), 0);
        }
        // A large frame decodes whole, without its prefix.
        let big = req(vec![7; 1 << 20]);
        let enc = encode_frame(&big).unwrap();
        assert_eq!(decode_large_ref(&enc[4..]).unwrap().into_owned(), big);
        assert!(decode_large_ref(&enc[4..enc.len() - 1]).is_err());
    }

    #[test]
    fn split_encodings_equal_the_whole() {
        for n in [0usize, 1, 250, 251, 65535, 65536, 1 << 20] {
            let Frame::Request(mut env) = req(vec![]) else {
                unreachable!()
            };
            let payload: Vec<u8> = (0..n).map(|i| i as u8).collect();
            let mut split = encode_request_head(&env, n).unwrap();
            split.extend_from_slice(&payload);
            env.payload = payload.clone();
            let whole = encode_frame(&Frame::Request(env.clone())).unwrap();
            assert_eq!(split, whole, "payload of {n} bytes");
            match decode_large_ref(&whole[4..]).unwrap() {
                FrameRef::Request(r) => assert_eq!(
                    (r.payload, r.msg_id, r.kind.as_str()),
                    (payload.as_slice(), env.msg_id, "feature_pull")
                ),
                other => panic!("{other:?}"),
            }
        }
        let Frame::Request(env) = req(vec![1]) else {
            unreachable!()
        };
        assert!(
            encode_request_head(&env, 1).is_err(),
            "payload must be outside"
        );
        for n in [0usize, 250, 251, 70_000] {
            let id = MsgId {
                node: 1,
                seq: 2 + n as u64,
            };
            let bytes: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
            let whole = encode_frame(&Frame::Reply {
                id,
                result: Ok(ByteVec(bytes.clone())),
            })
            .unwrap();
            let mut split = encode_reply_head(id, n).unwrap();
            split.extend_from_slice(&bytes);
            assert_eq!(split, whole, "reply of {n} bytes");
            assert!(
                matches!(decode_large_ref(&whole[4..]).unwrap(), FrameRef::Reply { id: i, result: Ok(b) } if i == id && b.0 == bytes.as_slice())
            );
        }
        let e = Frame::Reply {
            id: MsgId { node: 1, seq: 2 },
            result: Err(RemoteError::Stopped("a".into())),
        };
        assert!(matches!(
            decode_large_ref(&encode_frame(&e).unwrap()[4..]).unwrap(),
            FrameRef::Reply {
                result: Err(RemoteError::Stopped(_)),
                ..
            }
        ));
        let h = Frame::Heartbeat { sent_us: 5 };
        assert!(matches!(
            decode_large_ref(&encode_frame(&h).unwrap()[4..]).unwrap(),
            FrameRef::Heartbeat { sent_us: 5 }
        ));
    }

    #[test]
    fn payload_bytes_are_one_block() {
        // 1 MiB of payload costs 1 MiB plus a few header bytes, not a varint per element.
        let enc = encode_frame(&req(vec![200; 1 << 20])).unwrap();
        assert!(enc.len() < (1 << 20) + 64, "{}", enc.len());
    }

    #[test]
    fn oversized_and_garbage_frames_are_refused() {
        let mut d = FrameDecoder::new();
        d.push(&(u32::MAX).to_le_bytes()).unwrap();
        assert!(matches!(
            d.next_frame(),
            Err(WireError::FrameTooLarge { .. })
        ));

        let mut d = FrameDecoder::new();
        let garbage = [0xFFu8; 32];
        d.push(&(garbage.len() as u32).to_le_bytes()).unwrap();
        d.push(&garbage).unwrap();
        assert!(matches!(d.next_frame(), Err(WireError::Malformed(_))));

        // A truncated frame is not an error, just incomplete.
        let bytes = encode_frame(&req(vec![5; 10])).unwrap();
        let mut d = FrameDecoder::new();
        d.push(&bytes[..bytes.len() - 1]).unwrap();
        assert_eq!(d.next_frame(), Ok(None));

        // A payload that claims a huge length inside a small frame fails without allocating it.
        let mut inner = encode_frame(&req(vec![])).unwrap();
        let last = inner.len() - 1;
        inner[last] = 0xFC; // varint marker for a u32 length...
        inner.extend_from_slice(&(u32::MAX - 1).to_le_bytes()); // ...of ~4 GiB
        let len = (inner.len() - 4) as u32;
        inner[..4].copy_from_slice(&len.to_le_bytes());
        let mut d = FrameDecoder::new();
        d.push(&inner).unwrap();
        assert!(matches!(d.next_frame(), Err(WireError::Malformed(_))));

        // Invalid actor names are refused on decode too.
        let mut e = encode_frame(&req(vec![])).unwrap();
        let at = e.windows(7).position(|w| w == b"trainer").unwrap();
        e[at] = b'T';
        let mut d = FrameDecoder::new();
        d.push(&e).unwrap();
        assert!(
            matches!(d.next_frame(), Err(WireError::Malformed(m)) if m.contains("bad actor name"))
        );
    }

    /// Property test: random bytes, random splits and corrupted valid frames never
    /// panic, and whatever decodes re-encodes to the same bytes.
    #[test]
    fn decoder_survives_random_and_corrupted_input() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let valid = encode_frame(&req(vec![3; 40])).unwrap();
        for round in 0..3000 {
            let mut bytes = if round % 2 == 0 {
                let n = (next() % 200) as usize;
                (0..n).map(|_| next() as u8).collect::<Vec<u8>>()
            } else {
                let mut v = valid.clone();
                for _ in 0..1 + next() % 4 {
                    let i = (next() as usize) % v.len();
                    v[i] = next() as u8;
                }
                v
            };
            if round % 3 == 0 {
                bytes.truncate((next() as usize) % (bytes.len() + 1));
            }
            let mut d = FrameDecoder::new();
            'feed: for chunk in bytes.chunks(1 + (next() % 9) as usize) {
                if d.push(chunk).is_err() {
                    break;
                }
                loop {
                    match d.next_frame() {
                        Ok(Some(f)) => {
                            let re = encode_frame(&f).unwrap();
                            assert!(
                                bytes.windows(re.len()).any(|w| w == re.as_slice())
                                    || re.len() > bytes.len()
                            );
                        }
                        Ok(None) => break,
                        Err(_) => break 'feed,
                    }
                }
            }
            let _ = decode_large_ref(&bytes);
        }
    }

    #[test]
    fn tensors_round_trip_and_are_validated() {
        let t = TensorPayload::from_f32(&[2, 3], &[1.0, -2.0, 3.5, 0.0, 1e-7, 8.0]).unwrap();
        let back = TensorPayload::decode(&t.encode()).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.to_f32().unwrap(), vec![1.0, -2.0, 3.5, 0.0, 1e-7, 8.0]);
        assert!(TensorPayload::from_f32(&[2, 2], &[1.0]).is_err());
        let enc = t.encode();
        assert!(
            TensorPayload::decode(&enc[..enc.len() - 1]).is_err(),
            "truncated data"
        );
        assert!(
            TensorPayload::decode(&enc[..5]).is_err(),
            "truncated header"
        );
        let mut bad = enc.clone();
        bad[0] = 9;
        assert!(TensorPayload::decode(&bad).is_err(), "unknown dtype");
        // A shape claiming petabytes is refused before any copy.
        let mut huge = vec![0u8, 2];
        huge.extend_from_slice(&(1u64 << 40).to_le_bytes());
        huge.extend_from_slice(&(1u64 << 20).to_le_bytes());
        assert!(
            matches!(TensorPayload::decode(&huge), Err(WireError::BadTensor(m)) if m.contains("limit") || m.contains("overflows"))
        );
        let mut many = vec![0u8, 200];
        many.extend_from_slice(&[0; 16]);
        assert!(TensorPayload::decode(&many).is_err());
        // Through serde (inside messages) too: validated on decode, bytes as one block.
        let enc = encode_msg(&t).unwrap();
        assert_eq!(decode_msg::<TensorPayload>(&enc).unwrap(), t);
        assert!(enc.len() < 24 + 8 + 24);
        let lying = encode_msg(&RawTensorRef(0, &[4, 4], &[0; 12])).unwrap();
        assert!(decode_msg::<TensorPayload>(&lying).is_err());
        assert!(decode_msg::<TensorPayload>(&enc[..enc.len() - 1]).is_err());
    }

    #[test]
    fn actor_names_are_validated() {
        assert!(ActorName::new("sampler/2").is_ok());
        assert!(ActorName::new("features/field_of_study/0").is_ok());
        for bad in ["", "Sampler", "a b", "x\u{0}", &"a".repeat(300)] {
            assert!(ActorName::new(bad).is_err(), "{bad:?}");
        }
    }
}
