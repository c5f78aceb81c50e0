//! Compiles the protocols under `protos/jaxcluster/v1/` (`worker.proto`, `ps.proto`) into
//! Rust with protox (a pure-Rust protobuf compiler, so building needs no system `protoc`) and
//! tonic-prost-build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "protos/jaxcluster/v1/worker.proto",
        "protos/jaxcluster/v1/ps.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["protos"])?;
    tonic_prost_build::configure()
        // `bytes::Bytes` lets large payloads and array buffers be sliced out of the received
        // frame instead of copied into fresh `Vec`s.
        .bytes(".jaxcluster.v1")
        .compile_fds(descriptors)?;
    Ok(())
}
