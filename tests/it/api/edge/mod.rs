//! What every port shares (`src/api/edge/`): TLS and mutual TLS, and what one peer can hold.

mod port_bounds;
mod tls;
