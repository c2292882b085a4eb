//! What ships beside the code: the README's and the book's examples, the docs site, the Kubernetes
//! and Envoy deployment files, and the fuzz corpus replayed.

mod docs_site;
mod envoy_example;
mod fuzz_corpus;
mod kubernetes;
mod readme;
