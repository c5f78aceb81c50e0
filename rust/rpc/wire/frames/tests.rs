//! The framing against tonic's own expectations: the bytes are standard gRPC messages,
//! large fields travel by reference and come back as slices of what arrived, any cut of
//! the bytes into data chunks decodes the same, and bad input is refused with a status.

use std::future::poll_fn;
use std::pin::Pin;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use prost::Message;
use tokio_stream::StreamExt;

use super::*;
use crate::rpc::pb;

fn value(pickle: usize, buffers: &[usize]) -> pb::Value {
    pb::Value {
        pickle: Bytes::from((0..pickle).map(|i| (i % 253) as u8).collect::<Vec<_>>()),
        buffers: buffers
            .iter()
            .enumerate()
            .map(|(k, &n)| Bytes::from((0..n).map(|i| ((i + k) % 251) as u8).collect::<Vec<_>>()))
            .collect(),
    }
}

/// The plain gRPC framing of `message`: what tonic's codec writes.
fn reference_frame<M: Message>(message: &M) -> Vec<u8> {
    let mut out = vec![0u8];
    out.put_u32(u32::try_from(message.encoded_len()).unwrap());
    message.encode(&mut out).unwrap();
    out
}

fn encoded_segments<M: Message>(message: &M) -> Vec<Bytes> {
    let mut out = Segments::default();
    encode(message, &mut out, usize::MAX, "a test message").unwrap();
    out.seal();
    std::iter::from_fn(|| out.take()).collect()
}

#[test]
fn segments_are_the_standard_framing_and_share_large_fields() {
    let big = SHARED_FIELD_BYTES + 7;
    let message = value(100, &[10, big, big * 2]);
    let segments = encoded_segments(&message);
    assert_eq!(segments.concat(), reference_frame(&message));
    // The two large buffers are their own segments, the very memory of the message.
    for buffer in &message.buffers[1..] {
        let shared = segments.iter().find(|s| s.len() == buffer.len()).unwrap();
        assert_eq!(shared.as_ptr(), buffer.as_ptr(), "a large field was copied");
    }
    // The small buffer and the pickle were copied into a batch segment.
    assert!(segments
        .iter()
        .all(|s| s.as_ptr() != message.buffers[0].as_ptr()));
}

#[test]
fn a_message_over_the_limit_is_refused_and_nothing_is_written() {
    let message = value(10, &[2000]);
    let mut out = Segments::default();
    let e = encode(&message, &mut out, 1000, "a RunClosures request").unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert!(
        e.message().contains("a RunClosures request is 20"),
        "{}",
        e.message()
    );
    assert!(
        e.message().contains("limit of 1000 bytes"),
        "{}",
        e.message()
    );
    assert!(out.is_empty());
}

#[test]
fn a_field_inside_one_received_chunk_is_a_slice_of_it() {
    let message = value(50, &[SHARED_FIELD_BYTES * 3]);
    let mut unframer = Unframer::new(usize::MAX, "a test message");
    let mut kept = Vec::new();
    for segment in encoded_segments(&message) {
        kept.push(segment.clone());
        unframer.push(segment);
    }
    let back: pb::Value = unframer.next_message().unwrap().unwrap();
    assert_eq!(back, message);
    let frame = kept
        .iter()
        .find(|s| s.len() == message.buffers[0].len())
        .unwrap();
    assert_eq!(
        back.buffers[0].as_ptr(),
        frame.as_ptr(),
        "the field was copied out"
    );
    assert!(!unframer.mid_message());
    assert!(unframer.next_message::<pb::Value>().unwrap().is_none());
}

proptest! {
    /// Any cut of a sequence of messages into chunks decodes back to the same messages.
    #[test]
    fn any_cut_of_the_bytes_decodes_the_same(
        sizes in proptest::collection::vec((0usize..300, proptest::collection::vec(0usize..70_000, 0..3)), 1..5),
        cuts in proptest::collection::vec(1usize..90_000, 1..40),
    ) {
        let messages: Vec<pb::Value> = sizes.iter().map(|(p, b)| value(*p, b)).collect();
        let wire: Vec<u8> = messages.iter().flat_map(reference_frame).collect();
        let wire = Bytes::from(wire);
        let mut unframer = Unframer::new(usize::MAX, "a test message");
        let mut decoded = Vec::new();
        let mut offset = 0;
        let mut cuts = cuts.into_iter().cycle();
        while offset < wire.len() {
            let end = (offset + cuts.next().unwrap()).min(wire.len());
            unframer.push(wire.slice(offset..end));
            offset = end;
            while let Some(m) = unframer.next_message::<pb::Value>().unwrap() {
                decoded.push(m);
            }
        }
        prop_assert_eq!(decoded, messages);
        prop_assert!(!unframer.mid_message());
    }

    /// The rope reads like one contiguous buffer however it was cut.
    #[test]
    fn a_rope_reads_like_its_concatenation(
        parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..8),
        takes in proptest::collection::vec(0usize..50, 1..10),
    ) {
        let whole: Vec<u8> = parts.concat();
        let mut rope = Rope::default();
        for p in &parts {
            rope.push(Bytes::from(p.clone()));
        }
        let mut offset = 0;
        for (i, take) in takes.into_iter().enumerate() {
            let take = take.min(rope.remaining());
            let got = match i % 3 {
                0 => rope.copy_to_bytes(take).to_vec(),
                1 => { let mut head = rope.split_to(take); head.copy_to_bytes(take).to_vec() }
                _ => { let got = rope.chunk()[..take.min(rope.chunk().len())].to_vec(); rope.advance(got.len()); got }
            };
            prop_assert_eq!(&got[..], &whole[offset..offset + got.len()]);
            offset += got.len();
            prop_assert_eq!(rope.remaining(), whole.len() - offset);
        }
    }
}

#[test]
fn oversized_compressed_and_malformed_messages_are_refused() {
    let mut unframer = Unframer::new(100, "a RunClosures response");
    let mut prefix = BytesMut::new();
    prefix.put_u8(0);
    prefix.put_u32(101);
    unframer.push(prefix.freeze());
    let e = unframer.next_message::<pb::Value>().unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert!(
        e.message().contains("a RunClosures response is 101 bytes"),
        "{}",
        e.message()
    );

    let mut unframer = Unframer::new(100, "a RunClosures response");
    unframer.push(Bytes::from_static(&[1, 0, 0, 0, 1, 0]));
    let e = unframer.next_message::<pb::Value>().unwrap_err();
    assert_eq!(e.code(), tonic::Code::Internal);
    assert!(e.message().contains("compressed"), "{}", e.message());

    let mut unframer = Unframer::new(100, "a RunClosures request");
    unframer.push(Bytes::from_static(&[0, 0, 0, 0, 2, 0xff, 0xff]));
    let e = unframer.next_message::<pb::Value>().unwrap_err();
    // Worded as tonic's decode error, so the worker's rewrite makes it INVALID_ARGUMENT.
    let rewritten = crate::rpc::wire::limits::malformed(&e).expect("recognised as malformed");
    assert_eq!(rewritten.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("a RunClosures request (2 bytes)"),
        "{}",
        e.message()
    );
}

async fn drain<B: http_body::Body<Data = Bytes, Error = tonic::Status> + Unpin>(
    mut body: B,
) -> (
    Vec<Bytes>,
    Option<tonic::codegen::http::HeaderMap>,
    Option<tonic::Status>,
) {
    let mut data = Vec::new();
    loop {
        match poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            None => return (data, None, None),
            Some(Err(status)) => return (data, None, Some(status)),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(d) => data.push(d),
                Err(frame) => return (data, frame.into_trailers().ok(), None),
            },
        }
    }
}

#[tokio::test]
async fn a_response_body_batches_small_messages_and_ends_with_the_status() {
    let small: Vec<Result<pb::Value, tonic::Status>> =
        (0..10).map(|_| Ok(value(20, &[8]))).collect();
    let body = FramedBody::new(
        tokio_stream::iter(small.clone()),
        usize::MAX,
        "a value",
        Ending::Response,
    );
    let (data, trailers, error) = drain(body).await;
    assert!(error.is_none());
    assert_eq!(
        data.len(),
        1,
        "ten small messages ready at once are one data chunk"
    );
    let status = tonic::Status::from_header_map(&trailers.unwrap()).unwrap();
    assert_eq!(status.code(), tonic::Code::Ok);

    let mut failing = small[..2].to_vec();
    failing.push(Err(tonic::Status::invalid_argument("bad chunk sequence")));
    let body = FramedBody::new(
        tokio_stream::iter(failing),
        usize::MAX,
        "a value",
        Ending::Response,
    );
    let (data, trailers, _) = drain(body).await;
    let mut unframer = Unframer::new(usize::MAX, "a value");
    for d in data {
        unframer.push(d);
    }
    assert!(unframer.next_message::<pb::Value>().unwrap().is_some());
    assert!(unframer.next_message::<pb::Value>().unwrap().is_some());
    let status = tonic::Status::from_header_map(&trailers.unwrap()).unwrap();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(status.message(), "bad chunk sequence");

    // A request body just ends; an oversized message fails it after what came before.
    let body = FramedBody::new(
        tokio_stream::iter(vec![Ok(value(1, &[])), Ok(value(5000, &[]))]),
        1000,
        "a RunClosures request",
        Ending::Request,
    );
    let (data, trailers, error) = drain(body).await;
    assert!(trailers.is_none());
    assert_eq!(data.concat(), reference_frame(&value(1, &[])));
    assert_eq!(error.unwrap().code(), tonic::Code::ResourceExhausted);
}

/// An HTTP body of given frames, for reading them back with [`Unframed`].
struct Frames(std::collections::VecDeque<Frame<Bytes>>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = tonic::Status;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        std::task::Poll::Ready(self.0.pop_front().map(Ok))
    }
}

#[tokio::test]
async fn unframed_reads_messages_then_the_trailers_status() {
    let messages = [value(3, &[SHARED_FIELD_BYTES]), value(4, &[])];
    let mut frames: std::collections::VecDeque<_> = messages
        .iter()
        .flat_map(encoded_segments)
        .map(Frame::data)
        .collect();
    let mut trailers = tonic::codegen::http::HeaderMap::new();
    tonic::Status::unavailable("draining")
        .add_header(&mut trailers)
        .unwrap();
    frames.push_back(Frame::trailers(trailers));
    let got: Vec<_> =
        Unframed::<_, pb::Value>::new(Frames(frames), usize::MAX, "a value", Ending::Response)
            .collect()
            .await;
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].as_ref().unwrap(), &messages[0]);
    assert_eq!(got[1].as_ref().unwrap(), &messages[1]);
    assert_eq!(
        got[2].as_ref().unwrap_err().code(),
        tonic::Code::Unavailable
    );

    // A response cut without trailers says so; a request body may just end.
    let cut = || -> std::collections::VecDeque<_> {
        encoded_segments(&messages[1])
            .into_iter()
            .map(Frame::data)
            .collect()
    };
    let got: Vec<_> =
        Unframed::<_, pb::Value>::new(Frames(cut()), usize::MAX, "a value", Ending::Response)
            .collect()
            .await;
    assert!(got[1]
        .as_ref()
        .unwrap_err()
        .message()
        .contains("without a gRPC status"));
    let got: Vec<_> =
        Unframed::<_, pb::Value>::new(Frames(cut()), usize::MAX, "a value", Ending::Request)
            .collect()
            .await;
    assert_eq!(got.len(), 1);
    assert!(got[0].is_ok());

    // A request cut in the middle of a message is refused, not taken as a half-close.
    let whole = encoded_segments(&messages[1]).concat();
    let half: std::collections::VecDeque<_> =
        [Frame::data(Bytes::from(whole[..whole.len() - 1].to_vec()))].into();
    let got: Vec<_> =
        Unframed::<_, pb::Value>::new(Frames(half), usize::MAX, "a value", Ending::Request)
            .collect()
            .await;
    assert_eq!(
        got[0].as_ref().unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
}

#[test]
fn a_large_message_arriving_in_pieces_is_assembled_as_it_comes() {
    let large = value(10, &[ASSEMBLE_BYTES * 3 + 11]);
    let small = value(7, &[5]);
    let wire = Bytes::from([reference_frame(&large), reference_frame(&small)].concat());
    for piece in [1_000_usize, 65_536, ASSEMBLE_BYTES, ASSEMBLE_BYTES * 2 + 3] {
        let mut unframer = Unframer::new(usize::MAX, "a test message");
        let mut got = Vec::new();
        for start in (0..wire.len()).step_by(piece) {
            unframer.push(wire.slice(start..(start + piece).min(wire.len())));
            while let Some(m) = unframer.next_message::<pb::Value>().unwrap() {
                got.push(m);
            }
            if got.is_empty() && start + piece < wire.len() - 100 {
                assert!(unframer.mid_message());
            }
        }
        assert_eq!(got, vec![large.clone(), small.clone()], "pieces of {piece}");
        assert!(!unframer.mid_message());
    }
}
