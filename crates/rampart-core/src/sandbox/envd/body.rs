//! The bodies of the envd road: one boxed type both ways, whatever body the face's server
//! reads requests with (it wraps ours to answer).

use bytes::Bytes;
use futures::{Stream, StreamExt};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyDataStream, BodyExt, Full, StreamBody};
use hyper::body::{Body, Frame};

/// The error of a body on the envd road.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request's or an answer's body on the envd road ([`crate::Sandbox::envd`]).
pub type EnvdBody = UnsyncBoxBody<Bytes, BoxError>;

/// A body's data, chunk by chunk.
pub(crate) type Data = BodyDataStream<EnvdBody>;

/// Any body, boxed.
pub(crate) fn boxed<B>(b: B) -> EnvdBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    b.map_err(Into::into).boxed_unsync()
}

/// A body of `bytes`, whole.
pub(crate) fn full(bytes: impl Into<Bytes>) -> EnvdBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A body streamed from `s`.
pub(crate) fn stream<S, E>(s: S) -> EnvdBody
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: Into<BoxError>,
{
    StreamBody::new(s.map(|r| r.map(Frame::data).map_err(Into::into))).boxed_unsync()
}

/// The data of `b`, chunk by chunk (trailers are skipped).
pub(crate) fn data(b: EnvdBody) -> Data {
    BodyDataStream::new(b)
}
