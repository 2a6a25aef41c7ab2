//! Links the `runner` executable at a fixed address on Linux (not position-independent).
//!
//! A position-independent executable is relocated by the dynamic loader at every start:
//! for runner that is ~127,000 relocations written over ~2.8 MB of pointer tables, each page
//! copied on first write — about 4 ms of a `runner --version` that otherwise takes under 2.
//! Linked at a fixed address, those tables are final in the file and mapped as they are
//! read. The libraries, the heap and the stacks are still placed at random; only the
//! executable's own image is not. Tests and benches are linked as before.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
}
