//! Compiles `proto/iop/runtime.proto` with protox (no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = "../proto";
    let file = "../proto/iop/runtime.proto";
    println!("cargo:rerun-if-changed={file}");
    let fds = protox::compile([file], [proto_dir])?;
    let mut config = prost_build::Config::new();
    // Body and JSON fields decode as `bytes::Bytes`: zero-copy slices of the frame.
    config.bytes(["."]);
    config.compile_fds(fds)?;
    Ok(())
}
