//! Runs the `rampart bench --egress` measurement on its own:
//! `cargo run --release -p rampart-egress --features bench --example egress_bench -- 200`.

fn main() {
    let n = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100);
    match rampart_egress::bench::run(n) {
        Ok(r) => println!("{}", r.report()),
        Err(e) => {
            eprintln!("egress bench: {e}");
            std::process::exit(1);
        }
    }
}
