//! Embeds the console's third-party browser code (xterm.js and its fit addon), which
//! `scripts/console-assets.sh` fetches into `console/vendor/` (pinned by digest; not in git).
//! Without it the binary still builds: the console then says its terminal is missing and how
//! to add it.

use std::path::Path;

const FILES: [&str; 3] = ["xterm.js", "xterm.css", "addon-fit.js"];

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("console/vendor");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    println!("cargo:rerun-if-changed=console/vendor");
    let mut missing = Vec::new();
    for f in FILES {
        println!("cargo:rerun-if-changed=console/vendor/{f}");
        let bytes = std::fs::read(dir.join(f)).unwrap_or_else(|_| {
            missing.push(f);
            Vec::new()
        });
        std::fs::write(Path::new(&out).join(f), bytes).expect("write to OUT_DIR");
    }
    let present = missing.is_empty();
    if !present {
        println!(
            "cargo:warning=the console's terminal (xterm.js) is not in {}: run \
             scripts/console-assets.sh and rebuild; the console works without its terminal",
            dir.display()
        );
    }
    std::fs::write(
        Path::new(&out).join("vendor_present.rs"),
        format!("pub(crate) const VENDOR_PRESENT: bool = {present};\n"),
    )
    .expect("write to OUT_DIR");
}
