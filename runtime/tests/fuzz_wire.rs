//! Fuzzing of the wire decoders as property tests: arbitrary bytes and
//! mutated valid frames through the streaming frame decoder, the large-frame
//! decoder, message and tensor decoding. They must return errors, never
//! panic, never allocate much more than the bytes they were given (a declared
//! length is no reason to allocate), and valid frames must round-trip.
//!
//! A bounded number of cases by default; `HETGNN_FUZZ_CASES=200000` runs
//! that many per property:
//! `HETGNN_FUZZ_CASES=200000 cargo test -p runtime --release --test fuzz_wire`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use proptest::prelude::*;
use proptest::sample::Index;
use runtime::wire::{
    decode_large_ref, decode_msg, encode_frame, encode_msg, encode_reply_head, encode_request_head,
    FrameRef, WireDType, MAX_DIMS, MAX_FRAME,
};
use runtime::{
    ActorName, ByteVec, Envelope, Frame, FrameDecoder, MsgId, RemoteError, TensorPayload, WireError,
};

/// Cases per property unless `HETGNN_FUZZ_CASES` says otherwise (the file runs in a few seconds).
const DEFAULT_CASES: u32 = 5000;

fn config() -> ProptestConfig {
    let cases = std::env::var("HETGNN_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    ProptestConfig::with_cases(cases)
}

/// The system allocator, noting per thread the largest block asked for.
struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: allocations while the thread's locals are torn down are not noted.
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Tracking = Tracking;

/// `f`'s result and the largest block it allocated.
fn largest_alloc<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LARGEST.with(|l| l.set(0));
    let r = f();
    (r, LARGEST.with(|l| l.get()))
}

/// Allocation allowed beyond the input's size: error messages, small vectors.
const SLACK: usize = 4 << 10;

fn name() -> impl Strategy<Value = ActorName> {
    prop_oneof![9 => "[a-z0-9_./-]{1,24}", 1 => "[a-z0-9_./-]{250,256}"]
        .prop_map(|s| ActorName::new(&s).expect("a valid name"))
}

fn msg_id() -> impl Strategy<Value = MsgId> {
    (any::<u32>(), any::<u64>()).prop_map(|(node, seq)| MsgId { node, seq })
}

/// Byte blocks across bincode's length encodings (one byte, then u16, then u32).
fn block() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![8 => prop::collection::vec(any::<u8>(), 0..300), 1 => prop::collection::vec(any::<u8>(), 65_500..65_600)]
}

fn remote_error() -> impl Strategy<Value = RemoteError> {
    prop_oneof![
        any::<String>().prop_map(RemoteError::NoSuchActor),
        (any::<String>(), any::<String>())
            .prop_map(|(actor, kind)| RemoteError::NoHandler { actor, kind }),
        any::<String>().prop_map(RemoteError::BadMessage),
        any::<String>().prop_map(RemoteError::Stopped),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (name(), name(), msg_id(), name(), any::<u64>(), block()).prop_map(
            |(to, from, msg_id, kind, ttl_ms, payload)| Frame::Request(Envelope {
                to,
                from,
                msg_id,
                kind,
                ttl_ms,
                payload
            })
        ),
        (
            msg_id(),
            prop_oneof![
                block().prop_map(|b| Ok(ByteVec(b))),
                remote_error().prop_map(Err)
            ]
        )
            .prop_map(|(id, result)| Frame::Reply { id, result }),
        any::<u64>().prop_map(|sent_us| Frame::Heartbeat { sent_us }),
        msg_id().prop_map(|id| Frame::Probe { id }),
        msg_id().prop_map(|id| Frame::Unheard { id }),
    ]
}

fn tensor() -> impl Strategy<Value = TensorPayload> {
    let dtype = prop_oneof![
        Just(WireDType::F32),
        Just(WireDType::I64),
        Just(WireDType::U32)
    ];
    (dtype, prop::collection::vec(0u64..5, 0..=MAX_DIMS)).prop_flat_map(|(dtype, shape)| {
        let size = if dtype == WireDType::I64 { 8 } else { 4 };
        let bytes = shape.iter().product::<u64>() as usize * size;
        prop::collection::vec(any::<u8>(), bytes)
            .prop_map(move |data| TensorPayload::new(dtype, &shape, data).expect("consistent"))
    })
}

/// One edit of an encoding, aimed at what a decoder trusts: lengths, tags, the end.
#[derive(Clone, Debug)]
enum Mutation {
    Set(Index, u8),
    Flip(Index, u8),
    Insert(Index, Vec<u8>),
    Remove(Index, usize),
    Truncate(Index),
    /// A bincode varint (a length or a count) written over the bytes at the place.
    Varint(Index, u64),
    /// A little-endian u32 (a frame's length prefix) written over the bytes at the place.
    U32(Index, u32),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let big = prop_oneof![
        0u64..300,
        60_000u64..70_000,
        any::<u32>().prop_map(u64::from),
        any::<u64>()
    ];
    prop_oneof![
        3 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        3 => (any::<Index>(), 1u8..=255).prop_map(|(i, b)| Mutation::Flip(i, b)),
        1 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..9)).prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => (any::<Index>(), 1usize..9).prop_map(|(i, n)| Mutation::Remove(i, n)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        2 => (any::<Index>(), big).prop_map(|(i, v)| Mutation::Varint(i, v)),
        1 => (any::<Index>(), any::<u32>()).prop_map(|(i, v)| Mutation::U32(i, v)),
    ]
}

fn varint(v: u64) -> Vec<u8> {
    match v {
        0..=250 => vec![v as u8],
        251..=0xFFFF => [&[251u8][..], &(v as u16).to_le_bytes()].concat(),
        0x1_0000..=0xFFFF_FFFF => [&[252u8][..], &(v as u32).to_le_bytes()].concat(),
        _ => [&[253u8][..], &v.to_le_bytes()].concat(),
    }
}

fn apply(bytes: &mut Vec<u8>, muts: &[Mutation]) {
    for m in muts {
        let at = |i: &Index, b: &Vec<u8>| if b.is_empty() { 0 } else { i.index(b.len()) };
        let overwrite = |b: &mut Vec<u8>, i: usize, with: &[u8]| {
            let end = (i + with.len()).min(b.len());
            b.splice(i..end, with.iter().copied());
        };
        match m {
            Mutation::Set(i, v) if !bytes.is_empty() => {
                let i = at(i, bytes);
                bytes[i] = *v;
            }
            Mutation::Flip(i, v) if !bytes.is_empty() => {
                let i = at(i, bytes);
                bytes[i] ^= *v;
            }
            Mutation::Insert(i, v) => {
                let i = at(i, bytes);
                bytes.splice(i..i, v.iter().copied());
            }
            Mutation::Remove(i, n) if !bytes.is_empty() => {
                let i = at(i, bytes);
                bytes.drain(i..(i + n).min(bytes.len()));
            }
            Mutation::Truncate(i) => {
                let i = at(i, bytes);
                bytes.truncate(i);
            }
            Mutation::Varint(i, v) => {
                let i = at(i, bytes);
                overwrite(bytes, i, &varint(*v));
            }
            Mutation::U32(i, v) => {
                let i = at(i, bytes);
                overwrite(bytes, i, &v.to_le_bytes());
            }
            _ => {}
        }
    }
}

/// Feeds `bytes` to a frame decoder in pieces of the sizes in `cuts` (cycled),
/// checking what comes out; returns the frames decoded.
fn stream(bytes: &[u8], cuts: &[usize]) -> Result<Vec<Frame>, TestCaseError> {
    let (frames, largest) = largest_alloc(|| {
        let mut d = FrameDecoder::new();
        let mut frames = Vec::new();
        let (mut at, mut cut) = (0, cuts.iter().cycle());
        while at < bytes.len() {
            let end = (at + cut.next().copied().unwrap_or(1)).min(bytes.len());
            if d.push(&bytes[at..end]).is_err() {
                break;
            }
            at = end;
            loop {
                match d.next_frame() {
                    Ok(Some(f)) => frames.push((f, d.last_frame_len())),
                    Ok(None) => break,
                    Err(_) => return frames,
                }
            }
        }
        frames
    });
    prop_assert!(
        largest <= 2 * bytes.len() + SLACK,
        "{largest} bytes allocated at once for {} bytes of input",
        bytes.len()
    );
    let mut out = Vec::new();
    for (f, wire) in frames {
        // Whatever decodes is a frame that encodes within the bytes it came from
        // and decodes back to itself.
        let enc = encode_frame(&f).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(enc.len() <= wire && wire <= 4 + MAX_FRAME);
        let mut again = FrameDecoder::new();
        again
            .push(&enc)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(
            again
                .next_frame()
                .map_err(|e| TestCaseError::fail(e.to_string()))?,
            Some(f.clone())
        );
        out.push(f);
    }
    Ok(out)
}

/// Decodes `body` as a large frame, checking allocation and that borrowed bytes lie inside `body`.
fn large(body: &[u8]) -> Result<Option<Frame>, TestCaseError> {
    let (decoded, largest) = largest_alloc(|| {
        decode_large_ref(body).map(|f| {
            let inside = |b: &[u8]| {
                body.as_ptr_range().start <= b.as_ptr_range().start
                    && b.as_ptr_range().end <= body.as_ptr_range().end
            };
            let borrowed_inside = match &f {
                FrameRef::Request(r) => inside(r.payload),
                FrameRef::Reply { result: Ok(b), .. } => inside(b.0),
                _ => true,
            };
            (f.into_owned(), borrowed_inside)
        })
    });
    prop_assert!(
        largest <= 2 * body.len() + SLACK,
        "{largest} bytes allocated at once for a {}-byte body",
        body.len()
    );
    match decoded {
        Ok((f, inside)) => {
            prop_assert!(inside, "borrowed bytes outside the body");
            let enc = encode_frame(&f).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(
                decode_large_ref(&enc[4..]).map(FrameRef::into_owned),
                Ok(f.clone())
            );
            Ok(Some(f))
        }
        Err(WireError::FrameTooLarge { .. } | WireError::Malformed(_)) => Ok(None),
        Err(e) => Err(TestCaseError::fail(format!("unexpected error kind: {e}"))),
    }
}

/// Decodes `bytes` as a tensor, both ways (the hand-made encoding and inside messages).
fn tensors(bytes: &[u8]) -> Result<(), TestCaseError> {
    let ((plain, msg), largest) = largest_alloc(|| {
        (
            TensorPayload::decode(bytes),
            decode_msg::<TensorPayload>(bytes),
        )
    });
    prop_assert!(
        largest <= bytes.len() + SLACK,
        "{largest} bytes allocated at once for {} bytes of tensor",
        bytes.len()
    );
    for t in [plain, msg].into_iter().flatten() {
        // Whatever decodes is consistent and encodes back to what decodes to it.
        prop_assert_eq!(TensorPayload::decode(&t.encode()), Ok(t.clone()));
        let enc = encode_msg(&t).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(decode_msg::<TensorPayload>(&enc), Ok(t.clone()));
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn valid_frames_round_trip_through_every_decoder(frames in prop::collection::vec(frame(), 1..5), cuts in prop::collection::vec(1usize..700, 1..8)) {
        let encoded: Vec<Vec<u8>> = frames.iter().map(|f| encode_frame(f).unwrap()).collect();
        prop_assert_eq!(stream(&encoded.concat(), &cuts)?, frames.clone());
        for (f, enc) in frames.iter().zip(&encoded) {
            prop_assert_eq!(large(&enc[4..])?, Some(f.clone()));
            prop_assert_eq!(decode_msg::<Frame>(&enc[4..]), Ok(f.clone()));
            // The split encodings (head, then the bytes uncopied) equal the whole.
            match f {
                Frame::Request(env) => {
                    let head = encode_request_head(&Envelope { payload: Vec::new(), ..env.clone() }, env.payload.len()).unwrap();
                    prop_assert_eq!([head, env.payload.clone()].concat(), enc.clone());
                }
                Frame::Reply { id, result: Ok(b) } => prop_assert_eq!([encode_reply_head(*id, b.0.len()).unwrap(), b.0.clone()].concat(), enc.clone()),
                _ => {}
            }
        }
    }

    #[test]
    fn arbitrary_bytes_are_refused_without_panic_or_large_allocations(bytes in prop::collection::vec(any::<u8>(), 0..2048), cuts in prop::collection::vec(1usize..300, 1..8)) {
        stream(&bytes, &cuts)?;
        large(&bytes)?;
        tensors(&bytes)?;
        let (_, largest) = largest_alloc(|| decode_msg::<Frame>(&bytes));
        prop_assert!(largest <= bytes.len() + SLACK);
    }

    #[test]
    fn arbitrary_bytes_after_a_valid_length_prefix_are_refused(body in prop::collection::vec(any::<u8>(), 0..2048), cuts in prop::collection::vec(1usize..300, 1..8)) {
        // Random bytes alone rarely get past the length prefix: give them a correct one.
        let bytes = [&(body.len() as u32).to_le_bytes()[..], &body].concat();
        stream(&bytes, &cuts)?;
    }

    #[test]
    fn mutated_frames_are_refused_or_decode_consistently(f in frame(), muts in prop::collection::vec(mutation(), 1..6), cuts in prop::collection::vec(1usize..700, 1..8)) {
        let mut bytes = encode_frame(&f).unwrap();
        apply(&mut bytes, &muts);
        stream(&bytes, &cuts)?;
        large(&bytes[bytes.len().min(4)..])?;
        // A frame whose prefix was mutated still gets its body decoded with the true length.
        let len = bytes.len().saturating_sub(4) as u32;
        if bytes.len() >= 4 {
            bytes[..4].copy_from_slice(&len.to_le_bytes());
            stream(&bytes, &cuts)?;
        }
    }

    #[test]
    fn huge_declared_lengths_are_refused_before_allocating(len in (MAX_FRAME as u32 + 1)..=u32::MAX, inner in any::<u64>(), f in frame()) {
        // A small-stream frame announcing more than the limit.
        let (r, largest) = largest_alloc(|| {
            let mut d = FrameDecoder::new();
            d.push(&len.to_le_bytes()).unwrap();
            d.next_frame()
        });
        prop_assert!(matches!(r, Err(WireError::FrameTooLarge { .. })), "{:?}", r);
        prop_assert!(largest <= SLACK);
        // A valid frame whose byte block claims more than the frame holds.
        let mut enc = encode_frame(&f).unwrap();
        let block_len = match &f {
            Frame::Request(env) => Some(env.payload.len()),
            Frame::Reply { result: Ok(b), .. } => Some(b.0.len()),
            _ => None,
        };
        if let Some(n) = block_len {
            let claim = inner.max(n as u64 + 1);
            let head = enc.len() - n - varint(n as u64).len();
            enc.truncate(head);
            enc.extend(varint(claim));
            enc.resize(enc.len() + n, 0xAB);
            let body_len = (enc.len() - 4) as u32;
            enc[..4].copy_from_slice(&body_len.to_le_bytes());
            prop_assert_eq!(large(&enc[4..])?, None);
            prop_assert!(stream(&enc, &[enc.len()])?.is_empty());
        }
    }

    #[test]
    fn tensors_round_trip_and_mutated_ones_are_refused_or_consistent(t in tensor(), muts in prop::collection::vec(mutation(), 0..5)) {
        prop_assert_eq!(TensorPayload::decode(&t.encode()), Ok(t.clone()));
        let enc = encode_msg(&t).unwrap();
        prop_assert_eq!(decode_msg::<TensorPayload>(&enc), Ok(t.clone()));
        let (mut a, mut b) = (t.encode(), enc);
        apply(&mut a, &muts);
        apply(&mut b, &muts);
        tensors(&a)?;
        tensors(&b)?;
    }

    #[test]
    fn tensor_shapes_claiming_too_much_are_refused(dtype in 0u8..3, dims in prop::collection::vec(any::<u64>(), 0..12), data in prop::collection::vec(any::<u8>(), 0..64)) {
        let mut plain = vec![dtype, dims.len() as u8];
        for d in &dims {
            plain.extend_from_slice(&d.to_le_bytes());
        }
        plain.extend_from_slice(&data);
        tensors(&plain)?;
        let mut msg = vec![dtype];
        msg.extend(varint(dims.len() as u64));
        for d in &dims {
            msg.extend(varint(*d));
        }
        msg.extend(varint(data.len() as u64));
        msg.extend_from_slice(&data);
        tensors(&msg)?;
    }

    #[test]
    fn actor_names_are_accepted_exactly_by_the_rule(s in prop_oneof![any::<String>(), "[a-zA-Z0-9_./ -]{0,300}"]) {
        let ok = !s.is_empty() && s.len() <= 256 && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_./-".contains(&b));
        prop_assert_eq!(ActorName::new(&s).is_ok(), ok);
    }
}

/// The decoder holds at most one maximal frame plus what was pushed last,
/// however the bytes of an announced frame trickle in.
#[test]
fn the_stream_decoder_refuses_to_buffer_past_one_maximal_frame() {
    let mut d = FrameDecoder::new();
    d.push(&(MAX_FRAME as u32).to_le_bytes()).unwrap();
    let piece = vec![0u8; 1 << 20];
    let mut refused = false;
    for _ in 0..=(MAX_FRAME >> 20) + 1 {
        assert!(d.pending() <= 4 + MAX_FRAME + piece.len());
        if d.push(&piece).is_err() {
            refused = true;
            break;
        }
        // The frame is complete once MAX_FRAME bytes are in: garbage, so an error.
        if d.pending() >= 4 + MAX_FRAME {
            assert!(d.next_frame().is_err());
        }
    }
    assert!(refused || d.pending() >= 4 + MAX_FRAME);
}

/// Found by the properties above: a string's declared length was allocated
/// before the bytes were checked to be there (up to the stream's limit, 16 MiB
/// for a small frame and 1 GiB for a large one, from a frame of a few bytes).
#[test]
fn strings_declaring_more_than_the_frame_holds_allocate_nothing_for_them() {
    let env = Envelope {
        to: ActorName::new("a").unwrap(),
        from: ActorName::new("b").unwrap(),
        msg_id: MsgId { node: 1, seq: 2 },
        kind: ActorName::new("k").unwrap(),
        ttl_ms: 0,
        payload: vec![],
    };
    let enc = encode_frame(&Frame::Request(env)).unwrap();
    // The body: variant 0, then `to` as length 1 and "a"; claim far more.
    assert_eq!(&enc[4..7], &[0, 1, b'a']);
    for claim in [(MAX_FRAME - 64) as u64, (1 << 30) - 64] {
        let body = [&[0u8][..], &varint(claim), b"a", &enc[7..]].concat();
        let (r, largest) = largest_alloc(|| decode_large_ref(&body).map(|_| ()));
        assert!(matches!(r, Err(WireError::Malformed(_))), "{r:?}");
        assert!(
            largest <= body.len() + SLACK,
            "{largest} bytes for a claim of {claim}"
        );
        let framed = [&(body.len() as u32).to_le_bytes()[..], &body].concat();
        let (r, largest) = largest_alloc(|| {
            let mut d = FrameDecoder::new();
            d.push(&framed).unwrap();
            d.next_frame().map(|_| ())
        });
        assert!(matches!(r, Err(WireError::Malformed(_))), "{r:?}");
        assert!(
            largest <= 2 * framed.len() + SLACK,
            "{largest} bytes for a claim of {claim}"
        );
    }
    let err = Frame::Reply {
        id: MsgId { node: 1, seq: 2 },
        result: Err(RemoteError::Stopped("x".into())),
    };
    let enc = encode_frame(&err).unwrap();
    let body = [&enc[4..enc.len() - 2], &varint(1 << 29), b"x"].concat();
    let (r, largest) = largest_alloc(|| decode_msg::<Frame>(&body));
    assert!(
        r.is_err() && largest <= body.len() + SLACK,
        "{largest} bytes"
    );
}

/// Replies carry their errors as owned strings (`Result<_, String>`): a few
/// bytes declaring a long one are refused at the decoder's limit for a body
/// of their size, before a buffer of the declared length is made.
#[test]
fn owned_strings_declaring_more_than_their_message_holds_allocate_little() {
    for claim in [2u64 << 20, 1 << 29, 1 << 30] {
        let msg = [&[1u8][..], &varint(claim), b"oops"].concat();
        let (r, largest) = largest_alloc(|| decode_msg::<Result<(), String>>(&msg));
        assert!(matches!(r, Err(WireError::Malformed(_))), "{r:?}");
        assert!(
            largest <= (1 << 20) + SLACK,
            "{largest} bytes for a claim of {claim}"
        );
    }
    // Bodies of every size decode, strings and vectors of small numbers (which
    // bincode counts at their full width against its limit) included.
    for len in [0usize, 40 << 10, 600 << 10, 9 << 20] {
        let s = "y".repeat(len);
        assert_eq!(
            decode_msg::<Result<(), String>>(&encode_msg(&Err::<(), String>(s.clone())).unwrap()),
            Ok(Err(s))
        );
        let small = vec![0u128; len / 8];
        assert_eq!(
            decode_msg::<Vec<u128>>(&encode_msg(&small).unwrap()),
            Ok(small)
        );
    }
}

/// Found by the properties above: a tensor's shape was preallocated at its
/// declared count (up to 1 MiB from ten bytes) and read whole before the
/// dimension limit was checked.
#[test]
fn tensor_shapes_declaring_many_dimensions_allocate_nothing_for_them() {
    for count in [MAX_DIMS as u64 + 1, 100_000, 1 << 40] {
        let msg = [&[0u8][..], &varint(count), &[1u8; 64]].concat();
        let (r, largest) = largest_alloc(|| decode_msg::<TensorPayload>(&msg));
        assert!(r.is_err(), "{count} dimensions");
        assert!(largest <= SLACK, "{largest} bytes for {count} dimensions");
    }
}
