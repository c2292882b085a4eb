//! The HTTP port (`src/api/http/`): its defences, its tokens, its contract and OpenAPI description,
//! and the request path through several servers.

mod admin_token;
mod contract;
mod endpoint;
mod openapi;
mod request_path;
