//! Generates the gRPC code for `proto/flotilla/v1/` (fleet and rollouts), plus the file
//! descriptor set that server reflection serves. A `protoc` on PATH (or in
//! $PROTOC) is used when present; otherwise the vendored one.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let system_protoc = std::env::var_os("PROTOC").is_some()
        || std::process::Command::new("protoc")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
    let mut config = tonic_prost_build::Config::new();
    if !system_protoc {
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("flotilla_v1_descriptor.bin"))
        .compile_with_config(
            config,
            &[
                "proto/flotilla/v1/fleet.proto",
                "proto/flotilla/v1/rollouts.proto",
            ],
            &["proto"],
        )?;
    Ok(())
}
