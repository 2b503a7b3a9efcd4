//! Calls any method of the status API by its path, with a request encoded
//! from the service descriptor: tests that must cover every method, the
//! ones added later included, need no generated client per method.

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use prost_types::field_descriptor_proto::Type;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};

/// One RPC of the API, as the descriptor declares it.
#[derive(Debug, Clone)]
pub struct Method {
    /// `/flotilla.v1.FleetStatus/GetMicroservice`
    pub path: String,
    pub name: String,
    pub server_streaming: bool,
    /// The request's string fields: (number, name).
    pub string_fields: Vec<(i32, String)>,
}

/// Every method of every service in `descriptor_set`.
pub fn methods(descriptor_set: &[u8]) -> Vec<Method> {
    let set = prost_types::FileDescriptorSet::decode(descriptor_set).expect("a descriptor set");
    let messages: Vec<(String, &prost_types::DescriptorProto)> = set
        .file
        .iter()
        .flat_map(|f| {
            f.message_type
                .iter()
                .map(move |m| (format!(".{}.{}", f.package(), m.name()), m))
        })
        .collect();
    let mut out = Vec::new();
    for file in &set.file {
        for service in &file.service {
            for m in &service.method {
                let input = messages
                    .iter()
                    .find(|(name, _)| name == m.input_type())
                    .map(|(_, d)| *d)
                    .unwrap_or_else(|| panic!("{} has no request message", m.name()));
                out.push(Method {
                    path: format!("/{}.{}/{}", file.package(), service.name(), m.name()),
                    name: m.name().to_string(),
                    server_streaming: m.server_streaming(),
                    string_fields: input
                        .field
                        .iter()
                        .filter(|f| f.r#type() == Type::String)
                        .map(|f| (f.number(), f.name().to_string()))
                        .collect(),
                });
            }
        }
    }
    out
}

/// A request with the given string fields set (wire type 2), the rest
/// left at their defaults.
pub fn encode(fields: &[(i32, &str)]) -> Bytes {
    let mut buf = Vec::new();
    for (number, value) in fields {
        prost::encoding::string::encode(*number as u32, &value.to_string(), &mut buf);
    }
    Bytes::from(buf)
}

/// The bytes in, the bytes out.
#[derive(Debug, Clone, Default)]
pub struct RawCodec;

pub struct RawEncoder;
pub struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// Calls `method` with `body` and `token`: the status it ends with
/// (`Ok` for a unary answer, or a stream's first message).
pub async fn call(url: &str, method: &Method, body: Bytes, token: &str) -> Result<(), Status> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_string())
        .expect("url")
        .connect_timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| Status::unavailable(format!("connect: {e}")))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("ready: {e}")))?;
    let mut request = tonic::Request::new(body);
    request.set_timeout(std::time::Duration::from_secs(10));
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    let path: http::uri::PathAndQuery = method.path.parse().expect("path");
    if method.server_streaming {
        let mut stream = grpc
            .server_streaming(request, path, RawCodec)
            .await?
            .into_inner();
        match tokio::time::timeout(std::time::Duration::from_secs(10), stream.message()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => Err(status),
            Err(_) => Err(Status::new(Code::DeadlineExceeded, "no first message")),
        }
    } else {
        grpc.unary(request, path, RawCodec).await.map(|_| ())
    }
}
