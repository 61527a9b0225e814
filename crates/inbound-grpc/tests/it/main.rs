//! The gRPC server's integration tests in one test binary, the same layout as the other
//! packages'. One module: `cargo test -p inbound-grpc --test it rls::`.

mod rls;
