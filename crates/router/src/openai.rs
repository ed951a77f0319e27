//! Errors in the OpenAI shape, `{"error": {"message", "type", "param",
//! "code"}}`, as responses and as a stream's closing event.

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Response, StatusCode};

use crate::relay::ResponseBody;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: &'static str,
    pub param: Option<&'static str>,
    pub message: String,
    /// Seconds for a `Retry-After` header.
    pub retry_after_s: Option<u64>,
    /// `x-ratelimit-*` headers of a request over a key's limit.
    pub rate_headers: Option<Box<[(&'static str, String)]>>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        // OpenAI's own API says `invalid_request_error` for every client
        // mistake (the `code` tells them apart) and `server_error` otherwise.
        let kind = match status.as_u16() {
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        ApiError {
            status,
            kind,
            code,
            param: None,
            message: message.into(),
            retry_after_s: None,
            rate_headers: None,
        }
    }

    /// Tells the client when to try again.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }

    pub fn param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub fn model_not_found(model: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "model_not_found",
            format!("The model `{model}` does not exist."),
        )
        .param("model")
    }

    pub fn json(&self) -> String {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
        .to_string()
    }

    pub fn into_response(self) -> Response<ResponseBody> {
        let mut response = json_response(self.status, self.json());
        if let Some(seconds) = self.retry_after_s {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        if let Some(pairs) = &self.rate_headers {
            crate::limits::insert_rate_headers(response.headers_mut(), &pairs[..]);
        }
        response
    }

    /// The two events that end a stream cut mid-way: the error, then
    /// `[DONE]`, so clients stop reading instead of hanging.
    pub fn stream_tail(&self, at_event_boundary: bool) -> Bytes {
        let lead = if at_event_boundary { "" } else { "\n\n" };
        Bytes::from(format!("{lead}data: {}\n\ndata: [DONE]\n\n", self.json()))
    }
}

pub fn json_response(status: StatusCode, body: String) -> Response<ResponseBody> {
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
