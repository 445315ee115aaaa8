//! The wire format.
//!
//! A frame is a 4-byte little-endian length followed by a bincode-encoded
//! [`Envelope`]. The length is checked against [`MAX_FRAME`] before any
//! buffer is sized for it, and bincode decodes under the same limit, so a
//! peer cannot make a receiver allocate more than a frame. Tensors travel as
//! [`TensorPayload`]: dtype, shape and raw little-endian bytes (not element by
//! element through serde), checked for consistency and size on decode.

use serde::{Deserialize, Serialize};

/// Largest frame accepted, header included (16 MiB). Larger payloads go on
/// streams of their own as tensors.
pub const MAX_FRAME: usize = 16 << 20;
/// Largest tensor accepted (4 GiB).
pub const MAX_TENSOR_BYTES: u64 = 4 << 30;
/// Most dimensions a tensor may have.
pub const MAX_DIMS: usize = 8;
/// Longest actor name.
pub const MAX_NAME: usize = 256;

const BINCODE: bincode::config::Configuration<bincode::config::LittleEndian, bincode::config::Varint, bincode::config::Limit<MAX_FRAME>> =
    bincode::config::standard().with_limit::<MAX_FRAME>();

/// Errors decoding or encoding wire data; any of them closes the stream it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A frame announces more bytes than [`MAX_FRAME`].
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    FrameTooLarge(usize),
    /// The frame's bytes are not a valid envelope.
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
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ActorName(String);

impl ActorName {
    /// Validates `name`.
    pub fn new(name: &str) -> Result<ActorName, WireError> {
        let ok = !name.is_empty()
            && name.len() <= MAX_NAME
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_./-".contains(&b));
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
    /// The sending node's index in the topology.
    pub node: u32,
    /// Sequence number on that node.
    pub seq: u64,
}

/// One message on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// Destination actor.
    pub to: ActorName,
    /// Sending actor.
    pub from: ActorName,
    /// Id for duplicate suppression.
    pub msg_id: MsgId,
    /// Message kind (for routing and per-kind byte accounting).
    pub kind: u16,
    /// Milliseconds since the cluster epoch after which the message is moot (0 = none).
    pub deadline_ms: u64,
    /// The bincode-encoded message.
    pub payload: Vec<u8>,
}

/// Encodes `env` as one frame (length prefix included).
pub fn encode_frame(env: &Envelope) -> Result<Vec<u8>, WireError> {
    let mut out = vec![0u8; 4];
    bincode::serde::encode_into_std_write(env, &mut out, BINCODE).map_err(|e| WireError::Malformed(e.to_string()))?;
    let len = out.len() - 4;
    if len > MAX_FRAME {
        return Err(WireError::FrameTooLarge(len));
    }
    out[..4].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(out)
}

/// Splits a byte stream into envelopes; feed it whatever arrives.
#[derive(Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
}

impl FrameDecoder {
    /// An empty decoder.
    pub fn new() -> FrameDecoder {
        FrameDecoder::default()
    }

    /// Appends received bytes; refuses to hold more than one maximal frame
    /// plus `bytes` undecoded (the caller drains with [`FrameDecoder::next_frame`]).
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        if self.buf.len() > 4 + MAX_FRAME {
            return Err(WireError::FrameTooLarge(self.buf.len()));
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// The next complete envelope, `Ok(None)` if more bytes are needed, or an
    /// error (after which the stream must be closed).
    pub fn next_frame(&mut self) -> Result<Option<Envelope>, WireError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > MAX_FRAME {
            return Err(WireError::FrameTooLarge(len));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let (env, used): (Envelope, usize) =
            bincode::serde::decode_from_slice(&self.buf[4..4 + len], BINCODE).map_err(|e| WireError::Malformed(e.to_string()))?;
        if used != len {
            return Err(WireError::Malformed(format!("{} trailing bytes in frame", len - used)));
        }
        self.buf.drain(..4 + len);
        Ok(Some(env))
    }

    /// Bytes received but not yet decoded.
    pub fn pending(&self) -> usize {
        self.buf.len()
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

/// A tensor as raw little-endian bytes with its dtype and shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorPayload {
    /// Element type.
    pub dtype: WireDType,
    /// Shape.
    pub shape: Vec<u64>,
    /// `product(shape) · size(dtype)` little-endian bytes.
    pub data: Vec<u8>,
}

impl TensorPayload {
    /// A float32 tensor.
    pub fn from_f32(shape: &[u64], values: &[f32]) -> Result<TensorPayload, WireError> {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = TensorPayload { dtype: WireDType::F32, shape: shape.to_vec(), data };
        t.check()?;
        Ok(t)
    }

    /// The values of a float32 tensor.
    pub fn to_f32(&self) -> Result<Vec<f32>, WireError> {
        if self.dtype != WireDType::F32 {
            return Err(WireError::BadTensor(format!("{:?} where f32 was expected", self.dtype)));
        }
        Ok(self.data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    }

    fn byte_len(dtype: WireDType, shape: &[u64]) -> Result<u64, WireError> {
        if shape.len() > MAX_DIMS {
            return Err(WireError::BadTensor(format!("{} dimensions (limit {MAX_DIMS})", shape.len())));
        }
        let bytes = shape
            .iter()
            .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| WireError::BadTensor(format!("shape {shape:?} overflows")))?;
        if bytes > MAX_TENSOR_BYTES {
            return Err(WireError::BadTensor(format!("{bytes} bytes exceeds the {MAX_TENSOR_BYTES}-byte limit")));
        }
        Ok(bytes)
    }

    fn check(&self) -> Result<(), WireError> {
        let want = Self::byte_len(self.dtype, &self.shape)?;
        if want != self.data.len() as u64 {
            return Err(WireError::BadTensor(format!("shape {:?} needs {want} bytes, got {}", self.shape, self.data.len())));
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
        let dtype = WireDType::from_code(code).ok_or_else(|| WireError::BadTensor(format!("unknown dtype code {code}")))?;
        let (&ndims, mut rest) = rest.split_first().ok_or_else(short)?;
        if ndims as usize > MAX_DIMS {
            return Err(WireError::BadTensor(format!("{ndims} dimensions (limit {MAX_DIMS})")));
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
            return Err(WireError::BadTensor(format!("shape {shape:?} needs {want} bytes, got {}", rest.len())));
        }
        Ok(TensorPayload { dtype, shape, data: rest.to_vec() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(payload: Vec<u8>) -> Envelope {
        Envelope {
            to: ActorName::new("features/author/1").unwrap(),
            from: ActorName::new("trainer/0").unwrap(),
            msg_id: MsgId { node: 2, seq: 77 },
            kind: 3,
            deadline_ms: 1234,
            payload,
        }
    }

    #[test]
    fn frames_round_trip_across_arbitrary_splits() {
        let a = env(vec![1, 2, 3]);
        let b = env(vec![9; 1000]);
        let mut bytes = encode_frame(&a).unwrap();
        bytes.extend(encode_frame(&b).unwrap());
        for split in [1, 3, 4, 5, 17, bytes.len() - 1] {
            let mut d = FrameDecoder::new();
            let mut got = Vec::new();
            for chunk in bytes.chunks(split) {
                d.push(chunk).unwrap();
                while let Some(e) = d.next_frame().unwrap() {
                    got.push(e);
                }
            }
            assert_eq!(got, vec![a.clone(), b.clone()], "split {split}");
            assert_eq!(d.pending(), 0);
        }
    }

    #[test]
    fn oversized_and_garbage_frames_are_refused() {
        let mut d = FrameDecoder::new();
        d.push(&(u32::MAX).to_le_bytes()).unwrap();
        assert_eq!(d.next_frame(), Err(WireError::FrameTooLarge(u32::MAX as usize)));

        let mut d = FrameDecoder::new();
        let garbage = [0xFFu8; 32];
        d.push(&(garbage.len() as u32).to_le_bytes()).unwrap();
        d.push(&garbage).unwrap();
        assert!(matches!(d.next_frame(), Err(WireError::Malformed(_))));

        // A truncated frame is not an error, just incomplete.
        let bytes = encode_frame(&env(vec![5; 10])).unwrap();
        let mut d = FrameDecoder::new();
        d.push(&bytes[..bytes.len() - 1]).unwrap();
        assert_eq!(d.next_frame(), Ok(None));

        // A payload that claims a huge length inside a small frame fails without allocating it.
        let mut inner = encode_frame(&env(vec![])).unwrap();
        let last = inner.len() - 1;
        inner[last] = 0xFC; // varint marker for a u32 length...
        inner.extend_from_slice(&(u32::MAX - 1).to_le_bytes()); // ...of ~4 GiB
        let len = (inner.len() - 4) as u32;
        inner[..4].copy_from_slice(&len.to_le_bytes());
        let mut d = FrameDecoder::new();
        d.push(&inner).unwrap();
        assert!(matches!(d.next_frame(), Err(WireError::Malformed(_))));

        // Invalid actor names are refused on decode too.
        let mut e = encode_frame(&env(vec![])).unwrap();
        let at = e.windows(7).position(|w| w == b"trainer").unwrap();
        e[at] = b'T';
        let mut d = FrameDecoder::new();
        d.push(&e).unwrap();
        assert!(matches!(d.next_frame(), Err(WireError::Malformed(m)) if m.contains("bad actor name")));
    }

    #[test]
    fn tensors_round_trip_and_are_validated() {
        let t = TensorPayload::from_f32(&[2, 3], &[1.0, -2.0, 3.5, 0.0, 1e-7, 8.0]).unwrap();
        let back = TensorPayload::decode(&t.encode()).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.to_f32().unwrap(), vec![1.0, -2.0, 3.5, 0.0, 1e-7, 8.0]);
        assert!(TensorPayload::from_f32(&[2, 2], &[1.0]).is_err());
        let enc = t.encode();
        assert!(TensorPayload::decode(&enc[..enc.len() - 1]).is_err(), "truncated data");
        assert!(TensorPayload::decode(&enc[..5]).is_err(), "truncated header");
        let mut bad = enc.clone();
        bad[0] = 9;
        assert!(TensorPayload::decode(&bad).is_err(), "unknown dtype");
        // A shape claiming petabytes is refused before any copy.
        let mut huge = vec![0u8, 2];
        huge.extend_from_slice(&(1u64 << 40).to_le_bytes());
        huge.extend_from_slice(&(1u64 << 20).to_le_bytes());
        assert!(matches!(TensorPayload::decode(&huge), Err(WireError::BadTensor(m)) if m.contains("limit") || m.contains("overflows")));
        let mut many = vec![0u8, 200];
        many.extend_from_slice(&[0; 16]);
        assert!(TensorPayload::decode(&many).is_err());
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
