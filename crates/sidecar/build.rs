//! The image build (deploy/sidecar/build.sh) links the proxy through
//! deploy/sidecar/link.sh, which reads a list of functions to place first;
//! cargo cannot see those files, so a change to either relinks through here.
fn main() {
    println!("cargo:rerun-if-changed=../../deploy/sidecar/startup.symbols");
    println!("cargo:rerun-if-changed=../../deploy/sidecar/link.sh");
    println!("cargo:rerun-if-env-changed=BALLAST_STARTUP_SYMBOLS");
}
