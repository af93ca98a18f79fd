//! The driver's HTTP client: one `POST` per connection with hyper's HTTP/1 client,
//! as a browser's double click or a retrying client would send it.

use std::net::SocketAddr;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Sends `POST path` to `addr` with `headers` and, if given, a JSON body; returns the
/// status and the JSON body of the answer.
pub async fn post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, String)],
    json: Option<&serde_json::Value>,
) -> Result<(u16, serde_json::Value), String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|error| format!("connect to {addr}: {error}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|error| format!("HTTP handshake with {addr}: {error}"))?;
    tokio::spawn(connection);
    let mut request = hyper::Request::post(path).header(hyper::header::HOST, addr.to_string());
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let body = match json {
        Some(json) => {
            request = request.header(hyper::header::CONTENT_TYPE, "application/json");
            Bytes::from(json.to_string())
        }
        None => Bytes::new(),
    };
    let request = request
        .body(Full::new(body))
        .map_err(|error| error.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|error| format!("POST {path} to {addr}: {error}"))?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|error| format!("read the answer of {addr}: {error}"))?
        .to_bytes();
    let json = serde_json::from_slice(&body)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&body).into_owned()));
    Ok((status, json))
}
