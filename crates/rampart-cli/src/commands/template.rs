//! `rampart template build|ls|inspect|rm|gc`: templates in the daemon's data directory.
//!
//! These commands work on the data directory directly (on the daemon's host, as root), not
//! through the API: a build runs sandboxes of its own (its own cgroup subtree and uid range)
//! and holds the store's lock (`<data>/images/lock`) so that builds, `rm` and `gc` never
//! overlap. The daemon reads the store at each create, so a built template can be used at
//! once, without a restart. See docs/templates.md.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use rampart_image::build::{BuildEvent, BuildOptions, Builder, JailRunner, DEFAULT_BUILD_UID_BASE};
use rampart_image::{Spec, Store};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `rampart template`.
#[derive(Debug, Args)]
pub struct TemplateArgs {
    /// Data directory of the daemon (default: as `rampart serve`).
    #[arg(long, global = true, value_name = "DIR", env = "RAMPART_DATA_DIR")]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: TemplateCommand,
}

#[derive(Debug, Subcommand)]
enum TemplateCommand {
    /// Build a template from a spec file (TOML; see docs/templates.md).
    Build(BuildArgs),
    /// List built templates.
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a template's manifest, layers and metadata (JSON).
    Inspect {
        /// Template name.
        name: String,
    },
    /// Remove template names (their layers go at the next `gc`).
    Rm {
        /// Template names.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Remove layers and manifests no template name references.
    Gc {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `rampart template build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The spec file.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    file: PathBuf,
    /// The template's name (default: the spec's `name`).
    #[arg(long)]
    name: Option<String>,
    /// Run every step again, ignoring cached step layers.
    #[arg(long)]
    no_cache: bool,
    /// Progress as NDJSON events on stderr and the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// First host uid of the build sandboxes' range of 65536.
    #[arg(long, env = "RAMPART_BUILD_UID_BASE", default_value_t = DEFAULT_BUILD_UID_BASE)]
    uid_base: u32,
    /// The `rampart-jailer` binary (default: next to this executable).
    #[arg(long, value_name = "PATH", env = "RAMPART_JAILER_BIN")]
    jailer_bin: Option<PathBuf>,
    /// The `rampart-agent` binary (default: next to this executable).
    #[arg(long, value_name = "PATH", env = "RAMPART_AGENT_BIN")]
    agent_bin: Option<PathBuf>,
}

fn helper(name: &str, given: Option<PathBuf>) -> Result<PathBuf> {
    let p = match given {
        Some(p) => p,
        None => std::env::current_exe()
            .context("cannot locate the rampart executable")?
            .parent()
            .map(|d| d.join(name))
            .ok_or_else(|| anyhow!("no directory for {name}"))?,
    };
    if !p.is_file() {
        bail!("{name} not found at {}", p.display());
    }
    Ok(p)
}

/// Runs `rampart template ...`; returns the exit code. Synchronous (a build drives its own
/// small runtimes).
pub fn run(a: TemplateArgs) -> Result<u8> {
    // What a build makes (layer roots, mmdebstrap's tree, extracted images) is read by every
    // sandbox's users: it must not take an operator's private umask (0077). The store's own
    // records are created with explicit private modes.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    let data = match a.data_dir {
        Some(d) => d,
        None => crate::data_dir::default_data_dir()?,
    };
    match a.command {
        TemplateCommand::Build(b) => build(&data, b),
        TemplateCommand::Ls { json } => {
            let Some(store) = Store::open_existing(&data) else {
                if json {
                    println!("[]");
                } else {
                    println!("no templates built in {}", data.display());
                }
                return Ok(0);
            };
            let list = store.list();
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(0);
            }
            println!(
                "{:<24} {:<14} {:>7} {:>10}  CREATED",
                "NAME", "ID", "LAYERS", "SIZE"
            );
            for t in list {
                println!(
                    "{:<24} {:<14} {:>7} {:>10}  {}",
                    t.name,
                    &t.id[..12],
                    t.layers.len(),
                    human(t.size_bytes),
                    t.created_at
                );
            }
            Ok(0)
        }
        TemplateCommand::Inspect { name } => {
            let store =
                Store::open_existing(&data).ok_or_else(|| anyhow!("unknown template {name:?}"))?;
            let (id, m) = store.resolve(&name)?;
            let layers: Vec<_> = m
                .layers
                .iter()
                .map(|k| {
                    let i = store.layer_info(k);
                    serde_json::json!({
                        "key": k,
                        "source": i.as_ref().map(|i| i.source.clone()),
                        "size_bytes": i.as_ref().map(|i| i.size_bytes),
                        "created_at": i.map(|i| i.created_at),
                    })
                })
                .collect();
            let v = serde_json::json!({
                "name": name,
                "id": id,
                "created_at": store.name(&name).map(|r| r.created_at),
                "config": m.config,
                "layers": layers,
            });
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(0)
        }
        TemplateCommand::Rm { names } => {
            let store = Store::open(&data)?;
            let _lock = store.lock()?;
            let mut code = 0;
            for n in names {
                match store.remove(&n) {
                    Ok(()) => println!("{n}"),
                    Err(e) => {
                        eprintln!("rampart template rm: {e}");
                        code = 1;
                    }
                }
            }
            Ok(code)
        }
        TemplateCommand::Gc { json } => {
            let store = Store::open(&data)?;
            let _lock = store.lock()?;
            store.clean_tmp();
            let r = store.gc()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "removed {} layers ({}) and {} manifests",
                    r.layers.len(),
                    human(r.bytes),
                    r.manifests.len()
                );
            }
            Ok(0)
        }
    }
}

fn human(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// Sets `flag` on SIGINT or SIGTERM. The handlers are installed before this returns; a
/// thread of its own waits for them.
fn on_interrupt(flag: Arc<AtomicBool>) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut int, mut term) = rt.block_on(async {
        Ok::<_, std::io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        ))
    })?;
    std::thread::Builder::new()
        .name("rampart-template-signals".into())
        .spawn(move || {
            rt.block_on(async move {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
                flag.store(true, Ordering::SeqCst);
            })
        })?;
    Ok(())
}

/// Builds a template; `Ok(0)` and the report, or the failure (nothing half-made is left).
pub fn build(data: &Path, a: BuildArgs) -> Result<u8> {
    let spec = Spec::load(&a.file)?;
    let name = a
        .name
        .clone()
        .or_else(|| spec.name.clone())
        .ok_or_else(|| anyhow!("the spec has no name: pass --name"))?;
    rampart_image::check_name(&name)?;
    let store = Store::open(data)?;
    let _lock = store.lock()?;
    store.clean_tmp();
    let runner = JailRunner::new(
        data,
        helper("rampart-jailer", a.jailer_bin.clone())?,
        helper("rampart-agent", a.agent_bin.clone())?,
        a.uid_base,
    )?;
    // `from = "template:base"` (or `template:code-interpreter-v1`): the daemon's built-in
    // templates (made at its first start).
    let builder = rampart_core::templates::with_builtins(
        Builder::new(&store, &runner, runner.uid_base()),
        &data.join("templates"),
    )
    .with_registry(rampart_image::registry::RegistryConfig::default().with_env()?);
    on_interrupt(builder.cancel.clone())?;
    let pb = if a.json {
        ProgressBar::hidden()
    } else {
        let pb = ProgressBar::new(spec.steps.len() as u64 + 1);
        pb.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        pb.enable_steady_tick(Duration::from_millis(120));
        pb
    };
    let json = a.json;
    let mut line = String::new();
    let mut events = |ev: BuildEvent| {
        if json {
            if let Ok(s) = serde_json::to_string(&ev) {
                let mut e = std::io::stderr().lock();
                let _ = writeln!(e, "{s}");
            }
            return;
        }
        let say = |s: String| {
            if pb.is_hidden() {
                eprintln!("{s}");
            } else {
                pb.println(s);
            }
        };
        match ev {
            BuildEvent::Step {
                index,
                total,
                kind,
                describe,
            } => {
                pb.set_message(format!("{kind}: {describe}"));
                say(format!("==> [{index}/{}] {describe}", total - 1));
            }
            BuildEvent::Output { text } => {
                line.push_str(&text);
                while let Some(i) = line.find('\n') {
                    let l: String = line.drain(..=i).collect();
                    say(format!("    {}", l.trim_end()));
                }
            }
            BuildEvent::StepDone { cached, secs, .. } => {
                if !line.is_empty() {
                    say(format!("    {}", std::mem::take(&mut line).trim_end()));
                }
                say(format!(
                    "    {} in {secs:.2} s",
                    if cached { "cached" } else { "done" }
                ));
                pb.inc(1);
            }
        }
    };
    let r = builder.build(
        &spec,
        &name,
        &BuildOptions {
            no_cache: a.no_cache,
            // An `image:` base logs in as `docker login` did on this host, if it did.
            registry_auth: match &spec.from {
                rampart_image::spec::Base::Image(r) => {
                    rampart_image::registry::docker_config_login(r)
                }
                _ => None,
            },
            ..Default::default()
        },
        &mut events,
    );
    pb.finish_and_clear();
    drop(runner);
    store.clean_tmp();
    match r {
        Ok(rep) => {
            if json {
                println!("{}", serde_json::to_string_pretty(&rep)?);
            } else {
                let cached = rep.steps.iter().filter(|s| s.cached).count();
                println!(
                    "built {} ({}) in {:.2} s: {} layers, {cached}/{} steps cached",
                    rep.name,
                    &rep.id[..12],
                    rep.secs,
                    rep.manifest.layers.len(),
                    rep.steps.len()
                );
            }
            Ok(0)
        }
        Err(rampart_image::ImageError::Interrupted) => {
            eprintln!("rampart template build: interrupted; nothing was kept");
            Ok(130)
        }
        Err(e) => Err(anyhow!(e).context("build failed; nothing was kept")),
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// `rampart bench --templates`: build times of a small template in a private data
/// directory: the sample image (host programs, no network) + a copy step + two run steps.
/// Cold (every step runs), warm (every step cached: the figure the cache is for), and with
/// only the last step changed (one build sandbox). Ratios against the cold build of the
/// same run.
pub fn bench(iterations: usize) -> Result<()> {
    let root = std::env::temp_dir().join(format!("rampart-bench-templates-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let data = root.join("data");
    let ctx = root.join("ctx");
    std::fs::create_dir_all(ctx.join("files"))?;
    std::fs::create_dir_all(&data)?;
    let agent = helper("rampart-agent", None)?;
    rampart_image::sample::write_host_image(&ctx.join("image"), std::slice::from_ref(&agent))?;
    std::fs::write(ctx.join("files/app.txt"), "app\n")?;
    let spec_text = |last: &str| {
        format!(
            "from = \"oci:image\"\n[[steps]]\ncopy = {{ src = \"files\", dest = \"/opt/app\" }}\n\
             [[steps]]\nrun = \"mkdir -p /opt/data && echo a > /opt/data/a\"\n\
             [[steps]]\nrun = \"echo {last} > /opt/data/last\"\n[[steps]]\nuser = \"user\"\n"
        )
    };
    let store = Store::open(&data)?;
    let runner = JailRunner::new(
        &data,
        helper("rampart-jailer", None)?,
        agent,
        DEFAULT_BUILD_UID_BASE,
    )?;
    let builder = Builder::new(&store, &runner, runner.uid_base());
    let opts = BuildOptions::default();
    let r = (|| -> Result<()> {
        let spec = Spec::parse(&spec_text("first"), &ctx)?;
        eprintln!("bench: template build, cold...");
        let t = std::time::Instant::now();
        let rep = builder.build(&spec, "bench", &opts, &mut |_| {})?;
        let cold = t.elapsed().as_secs_f64() * 1e3;
        anyhow::ensure!(rep
            .steps
            .iter()
            .filter(|s| !s.layers.is_empty())
            .all(|s| !s.cached));
        eprintln!("bench: template build, warm cache ({iterations} builds)...");
        let mut warm = Vec::new();
        for _ in 0..iterations {
            let t = std::time::Instant::now();
            let rep = builder.build(&spec, "bench", &opts, &mut |_| {})?;
            warm.push(t.elapsed().as_secs_f64() * 1e3);
            anyhow::ensure!(
                rep.steps.iter().all(|s| s.cached),
                "a warm build ran a step"
            );
        }
        eprintln!("bench: template build, last step changed ({iterations} builds)...");
        let mut one = Vec::new();
        for i in 0..iterations {
            let spec = Spec::parse(&spec_text(&format!("v{i}")), &ctx)?;
            let t = std::time::Instant::now();
            builder.build(&spec, "bench", &opts, &mut |_| {})?;
            one.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (w50, w90) = (pct(&mut warm, 0.5), pct(&mut warm, 0.9));
        let (o50, o90) = (pct(&mut one, 0.5), pct(&mut one, 0.9));
        println!("template build (sample image + copy + 2 run steps; ms)");
        println!("{:<44} {:>10} {:>10} {:>12}", "", "p50", "p90", "vs cold");
        println!(
            "{:<44} {:>10.1} {:>10} {:>11.3}x",
            "cold (every step runs)", cold, "-", 1.0
        );
        println!(
            "{:<44} {:>10.2} {:>10.2} {:>11.4}x",
            "warm cache (every step cached)",
            w50,
            w90,
            w50 / cold
        );
        println!(
            "{:<44} {:>10.1} {:>10.1} {:>11.3}x",
            "last step changed (one build sandbox)",
            o50,
            o90,
            o50 / cold
        );
        Ok(())
    })();
    drop(runner);
    let _ = std::fs::remove_dir_all(&root);
    r
}
