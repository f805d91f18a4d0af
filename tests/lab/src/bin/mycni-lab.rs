//! `mycni-lab`: the local multi-node lab (run through `cargo xtask lab`),
//! plus the small tools its pods and nodes run.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use mycni_lab::{self as lab, Bins, Lab, Spec, Stack, labbench, soak};

/// `cargo xtask lab` and `cargo xtask soak` hand their arguments to this
/// binary as they are: the flags below are the only declaration of them, and
/// this help is what `cargo xtask lab --help` shows.
#[derive(Parser)]
#[command(
    name = "mycni-lab",
    bin_name = "cargo xtask lab",
    about = "The local multi-node lab: node network namespaces running the real agent and \
             plugin against a Kubernetes API fixture. Without a command: up, test, then a NetworkPolicy \
             at work (the truth tables before, with and after a sample policy).",
    after_help = "`cargo xtask lab` and `cargo xtask soak` build what these commands run \
                  (the eBPF object, which the agent embeds, then the release binaries) \
                  before handing over to this binary; `test`, `status` and `down` use \
                  the binaries already built."
)]
struct Cli {
    /// Directory with mycni, mycni-agent, mycni-apiserver (default: this binary's).
    #[arg(long, global = true)]
    bin_dir: Option<PathBuf>,
    /// Lab state directory (default /run/mycni-lab; `bench` and `soak` use
    /// labs of their own).
    #[arg(long, global = true)]
    root: Option<PathBuf>,
    /// Number of nodes.
    #[arg(long, global = true, default_value_t = 3)]
    nodes: usize,
    /// Pods per node. With 3 nodes and 3 pods (the defaults) the lab is
    /// the upstream NetworkPolicy model (see `--model`).
    #[arg(long, global = true, default_value_t = 3)]
    pods: usize,
    /// At 3 nodes x 3 pods, make the pods the upstream NetworkPolicy
    /// model: namespaces x, y, z with pods a, b, c (Pod objects with
    /// labels, named ports and status.podIPs), TCP and UDP servers on 80
    /// and 81, a Service (ClusterIP DNAT in every node) per pod. Other
    /// sizes, or `--model false`, have anonymous pods (`lab/pod<j>`).
    #[arg(long, global = true, default_value_t = true, action = clap::ArgAction::Set)]
    model: bool,
    #[command(flatten)]
    up: UpArgs,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

/// How `up` (and the default up-then-test) starts the agents; `bench` and
/// `soak` choose their own.
#[derive(Args)]
struct UpArgs {
    /// The agents' datapath: `ebpf` (the tc fast path) or `kernel`. `up`
    /// fails (and removes the lab) when an agent runs another one, e.g.
    /// built without the eBPF object, naming the reason it gives.
    #[arg(long, global = true, default_value = "ebpf", value_parser = ["ebpf", "kernel"])]
    datapath: String,
    /// With `--datapath ebpf`: encapsulate in tc (datapath v2), or hand
    /// remote traffic to vxlan.1 (`false`).
    #[arg(long, global = true, default_value_t = true, action = clap::ArgAction::Set)]
    tc_encap: bool,
    /// Route peers on the underlay's own subnet (every node of the lab)
    /// without VXLAN: the agents' `--direct-routing`.
    #[arg(long, global = true, default_value_t = false, action = clap::ArgAction::Set)]
    direct_routing: bool,
    /// Give the Nodes IPv4 podCIDRs only (the lab is dual-stack by
    /// default: `spec.podCIDRs` of 10.244.<i>.0/24 and fd00:10:244:<i>::/64,
    /// and pods with an address of each).
    #[arg(long, global = true, conflicts_with = "ipv6_only")]
    ipv4_only: bool,
    /// IPv6 only, underlay included: the bridge and the nodes get IPv6
    /// addresses alone (fd00:77::/64: the bridge ::1, node i ::1i), the
    /// Nodes podCIDRs fd00:10:244:<i>::/64, the agents --cluster-cidr
    /// fd00:10:244::/56, the pods an IPv6 address each, reached through
    /// vxlan6.1; the matrix has the IPv6 table alone. `test`, `status` and
    /// `down` find the lab's stack without the flag.
    #[arg(long, global = true)]
    ipv6_only: bool,
    /// Extra agent arguments, e.g. `--agent-arg=--resync --agent-arg=1s`.
    #[arg(long, global = true, allow_hyphen_values = true)]
    agent_arg: Vec<String>,
    /// Run a real Prometheus in the underlay namespace scraping every
    /// agent, with deploy/monitoring's alerting rules; `up` fails unless it
    /// reports every agent target up.
    #[arg(long, global = true, default_value_t = true, action = clap::ArgAction::Set)]
    prometheus: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start N node netns on an underlay bridge, each with the real agent
    /// against the API fixture, and P pods per node; fails (and removes the
    /// lab) unless every agent runs the datapath asked for.
    Up,
    /// Print the connectivity matrix (ping, TCP, a bulk echo) of a running
    /// lab, then per node its datapath and the fast share of pod traffic.
    Test,
    /// Show nodes, pods, agent readiness and metrics endpoints.
    Status,
    /// Remove every namespace, process and file the lab created.
    Down,
    /// Datapath benchmarks side by side in one run (about 22 min): a direct
    /// veth, the underlay and overlay node to node (the floors), the kernel
    /// path, the eBPF fast path via vxlan.1 and with tc encap, and the kernel
    /// and fast paths with direct routing (node1 pod -> node2 pod), with and
    /// without a kube-proxy-sized iptables ruleset, and the kernel path and
    /// tc-encap fast path over the pods' IPv6 addresses (no rules; the lab
    /// is dual-stack); prints a table with
    /// medians, min-max, ratios against the targets and the fast share from
    /// the counters. Brings up its own 2-node x 1-pod lab (mycnib-*,
    /// /run/mycni-bench-lab) and tears it down; --nodes, --pods, --datapath,
    /// --tc-encap, --direct-routing and --agent-arg do not apply.
    Bench {
        /// Interleaved runs of every variant (the table shows medians and
        /// min-max).
        #[arg(long, default_value_t = labbench::DEFAULT_RUNS)]
        runs: usize,
        /// Seconds per measure (latency, stream, small packets).
        #[arg(long, default_value_t = labbench::DEFAULT_SECONDS)]
        seconds: u64,
        /// Services (2 endpoints each) in the kube-proxy ruleset.
        #[arg(long, default_value_t = 2000)]
        services: usize,
        /// Non-matching filter FORWARD rules in the synthetic ruleset.
        #[arg(long, default_value_t = 2000)]
        synthetic_rules: usize,
        /// CPU both ends of every measure (sockperf, iperf3) run on, or
        /// `none`. On a VM a cross-CPU wakeup can cost more than the whole
        /// datapath, and a placement left to the scheduler differs by run.
        #[arg(long, default_value = "1")]
        pin_cpu: String,
        /// Also write the markdown report here, and its chart beside it
        /// as SVG (`cargo xtask` sets target/lab-bench.md, so
        /// target/lab-bench.svg).
        #[arg(long, env = "MYCNI_LAB_BENCH_OUT")]
        out: Option<PathBuf>,
    },
    /// The long reliability cases (~5 min, `cargo xtask soak`) on labs of
    /// their own (mycnis-*, /run/mycni-soak-lab): 1,000 pod ADD/DEL cycles
    /// with SIGKILLed plugins, agent SIGKILLs, the agent away, a 60 s API
    /// outage, kernel state removed, a host IP moved, an upgrade with a
    /// changed map layout, a node re-added with a new podCIDR; long-lived TCP
    /// and UDP flows across nodes throughout; and NetworkPolicy on a model
    /// lab under agent SIGKILLs, an upgrade, an API outage and garbage
    /// policies, probed every 25 ms. Prints the table; fails on any leak,
    /// broken flow or wrong allow.
    Soak {
        /// Also write the markdown table here (`cargo xtask` sets
        /// target/soak.md).
        #[arg(long, env = "MYCNI_LAB_SOAK_OUT")]
        out: Option<PathBuf>,
        /// Run only the cases whose name contains this (repeatable), e.g.
        /// `--only "kernel state" --only "host IP"`: a short run while
        /// iterating on one of them.
        #[arg(long)]
        only: Vec<String>,
    },
    /// Add a pod to a running lab as a kubelet would: its Pod object
    /// (spec.nodeName, labels, named ports), the sandbox (the plugin's
    /// ADD), status.podIPs, servers on its ports and a Service; or delete
    /// one.
    Pod {
        #[command(subcommand)]
        cmd: PodCmd,
    },
    /// Print the NetworkPolicy truth tables of a running model lab as they
    /// are now: every pod to every pod, TCP and UDP on 80 and 81, by pod IP
    /// and by Service, per family (`.` reached, `X` not).
    Table {
        /// Add a row per node (the node's own traffic).
        #[arg(long)]
        node_rows: bool,
    },
    /// Run the NetworkPolicy suite on a running model lab: the upstream
    /// cases (1-28), the time-ordered ones, node to its own pod under
    /// default-deny-all and a pod whose named port is another number;
    /// each case's policies applied through the API, its tables settled
    /// (within 2 s) and compared, its policies deleted. Fails if any
    /// case's tables differ from the expected ones.
    Netpol {
        /// Only the cases whose name contains this (repeatable).
        #[arg(long)]
        only: Vec<String>,
    },
    #[command(hide = true)]
    EchoServer { port: u16 },
    /// Echo servers on PORT/PROTO (a pod's container ports).
    #[command(hide = true)]
    Serve { ports: Vec<String> },
    /// Probes the targets on stdin (JSON), all at once; JSON out.
    #[command(hide = true)]
    Probe {
        #[arg(long, default_value_t = 500)]
        timeout_ms: u64,
    },
    /// The host's loopback door to the API fixture.
    #[command(hide = true)]
    Forward {
        #[arg(long)]
        netns: String,
        #[arg(long)]
        to: std::net::SocketAddr,
        #[arg(long)]
        port_file: PathBuf,
    },
    #[command(hide = true)]
    TcpProbe {
        addr: String,
        /// Bytes to echo over the connection after the round trip.
        #[arg(long, default_value_t = 0)]
        bulk: usize,
    },
    #[command(hide = true)]
    HttpGet { addr: String, path: String },
    /// New connections per second against an echo server (connect, one
    /// byte echoed, close) and connect() p50/p99: the policy bench's
    /// connect loop.
    #[command(hide = true)]
    TcpCrr {
        addr: String,
        #[arg(long, default_value_t = 3)]
        seconds: u64,
    },
    /// TCP request/response latency against an echo server (the bench's
    /// IPv6 latency).
    #[command(hide = true)]
    TcpRr {
        addr: String,
        #[arg(long, default_value_t = 3)]
        seconds: u64,
        #[arg(long, default_value_t = 64)]
        size: usize,
    },
}

#[derive(Subcommand)]
enum PodCmd {
    /// e.g. `pod add --namespace x --name d --node 1 --label pod=d --port
    /// serve-80-tcp=8080/TCP`.
    Add(PodAdd),
    Delete {
        #[arg(long)]
        namespace: String,
        #[arg(long)]
        name: String,
    },
}

#[derive(Args)]
struct PodAdd {
    #[arg(long)]
    namespace: String,
    #[arg(long)]
    name: String,
    /// The node (1-based) the pod is scheduled on.
    #[arg(long, default_value_t = 1)]
    node: usize,
    /// KEY=VALUE, repeatable (default: pod=<name>).
    #[arg(long)]
    label: Vec<String>,
    /// NAME=PORT[/PROTOCOL], repeatable (default: the model's
    /// serve-80-tcp, serve-80-udp, serve-81-tcp, serve-81-udp).
    #[arg(long)]
    port: Vec<String>,
}

fn pod_add(lab: &Lab, add: &PodAdd) -> Result<()> {
    let PodAdd {
        namespace,
        name,
        node,
        label: labels,
        port: ports,
    } = add;
    let node = *node;
    let labels = if labels.is_empty() {
        vec![("pod".to_string(), name.to_string())]
    } else {
        labels
            .iter()
            .map(|l| {
                l.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .with_context(|| format!("--label {l:?}: want KEY=VALUE"))
            })
            .collect::<Result<_>>()?
    };
    let ports = if ports.is_empty() {
        lab::model::serve_ports()
    } else {
        ports
            .iter()
            .map(|p| lab::model::ContainerPort::parse(p))
            .collect::<Result<_>>()?
    };
    let pod = lab.add_kube_pod(&lab::PodRequest {
        namespace: namespace.to_string(),
        name: name.to_string(),
        node,
        labels,
        ports,
    })?;
    println!(
        "pod {namespace}/{name} ({}) on {}: {}",
        pod.ns,
        lab.spec.node_name(pod.node),
        pod.addresses()
    );
    Ok(())
}

/// The truth tables now.
fn table(lab: &Lab, node_rows: bool) -> Result<()> {
    let set = lab.probe_set(node_rows)?;
    if set.is_empty() {
        bail!("no pod of the lab has a Kubernetes side: bring it up as the model (3 x 3)");
    }
    let t0 = std::time::Instant::now();
    let observed = lab.probe(&set)?;
    print!("{}", observed.report(None));
    println!(
        "{} probes in {:.2} s",
        set.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `cargo xtask lab`'s last part: the truth tables with no policy, then
/// with a sample default-deny plus one allow (applied through the API as
/// kubectl would), then the policies removed again.
fn policy_demo(lab: &Lab) -> Result<()> {
    if !lab.kube_serves("networking.k8s.io/v1", "networkpolicies") {
        println!("NetworkPolicy: the API fixture serves no NetworkPolicies; no policy shown");
        return Ok(());
    }
    let set = lab.probe_set(false)?;
    let open: lab::netpol::Expect = lab::netpol::Reach::all(true).into();
    let before = lab.settle(&set, &open, std::time::Instant::now(), "no policy")?;
    println!(
        "NetworkPolicy truth tables ({} probes a round, by pod IP and by Service), no policy:",
        set.len()
    );
    print!("{}", before.observed.report(None));
    let case = lab::netpol::cases::sample();
    let report = lab.run_case(&set, &case)?;
    if let Some(step) = report.steps.first() {
        println!("with {}:", case.name);
        print!("{}", step.observed.report(Some(&step.expect)));
    }
    for s in &report.steps {
        println!("{}", s.line());
    }
    if !report.passed() || !before.comparison.matches() {
        bail!("the sample policy's tables are not the expected ones (see above)");
    }
    println!("sample policies removed: the lab is back to no policy");
    flows_demo(lab)
}

/// The flows the agents recorded while the sample policy was in force, as
/// `mycni-agent flows` shows them to an operator with a kubeconfig: a few
/// of each kind, and the drops with the policy that caused them.
fn flows_demo(lab: &Lab) -> Result<()> {
    let shown = [
        (
            "a connection's first packet each way (SYN, SYN-ACK), left to the kernel",
            vec!["--reason", "kernel_tcp_control", "--last", "1"],
        ),
        (
            "then on the fast path, as the program announced it",
            vec!["--reason", "fast_encap", "--last", "2"],
        ),
        (
            "admitted by the sample's allow rule",
            vec![
                "--verdict",
                "FORWARDED",
                "--policy",
                "x/allow-x-a-from-y-tcp-80",
                "--last",
                "2",
            ],
        ),
        (
            "dropped by the sample's default deny",
            vec![
                "--verdict",
                "DROPPED",
                "--policy",
                "x/default-deny-ingress",
                "--last",
                "3",
            ],
        ),
    ];
    println!("flows (every node's agent, as `mycni-agent flows --kubeconfig <lab>` prints them):");
    let mut drops = String::new();
    for (what, args) in &shown {
        let text = lab.flows_cli(args)?;
        println!("  {what} (flows {}):", args.join(" "));
        for line in text.lines().take(6) {
            println!("    {line}");
        }
        drops = text;
    }
    if !drops.contains("POLICY_DENIED") || !drops.contains("x/default-deny-ingress") {
        bail!("no policy drop with its policy's name in the flows (see above)");
    }
    let port = lab.start_host_forward("flows-map", lab.spec.metrics_socket(1))?;
    println!(
        "live: ip netns exec {} {} flows --kubeconfig {} --follow",
        lab.spec.underlay_ns(),
        lab.spec.bins.agent.display(),
        lab.spec.kubeconfig().display(),
    );
    println!("node 1's service map of its flows, from the host: http://127.0.0.1:{port}/flows/map");
    Ok(())
}

fn bins(cli: &Cli) -> Result<Bins> {
    let bin_dir = match &cli.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("exe dir")?
            .to_path_buf(),
    };
    Bins::in_dir(&bin_dir, "build with `cargo xtask lab`")
}

/// The soak's lab state (its labs are `mycnis-*`, see soak::soak_lab).
const SOAK_ROOT: &str = "/run/mycni-soak-lab";
const SOAK_PREFIX: &str = "mycnis";

/// The soak's cases never look for an interrupt, so a Ctrl-C would leave
/// their lab behind: a watcher removes it (the largest the soak makes, and
/// any churn pod namespace) and ends the process. The soak's own in-process
/// API fixture goes with the process.
fn watch_soak_interrupts(bins: Bins, root: &std::path::Path) {
    lab::catch_interrupts();
    let root = root.to_path_buf();
    std::thread::spawn(move || {
        while !lab::interrupted() {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("soak: interrupted; removing its lab");
        Lab::attach(Spec {
            prefix: SOAK_PREFIX.into(),
            nodes: 3,
            pods: 2,
            root,
            bins,
            agent_args: vec![],
            in_process_api: false,
            stack: Stack::Ipv4Only,
            model: false,
        })
        .down();
        if let Ok(list) = mycni_testkit::sh("ip", &["netns", "list"]) {
            let prefix = format!("{SOAK_PREFIX}-");
            for ns in list.lines().filter_map(|l| l.split_whitespace().next()) {
                if ns.starts_with(&prefix) {
                    let _ = mycni_testkit::sh("ip", &["netns", "del", ns]);
                }
            }
        }
        std::process::exit(130);
    });
}

fn spec(cli: &Cli, agent_args: Vec<String>) -> Result<Spec> {
    Ok(Spec {
        prefix: "mycni".into(),
        nodes: cli.nodes,
        pods: cli.pods,
        root: cli
            .root
            .clone()
            .unwrap_or_else(|| PathBuf::from("/run/mycni-lab")),
        bins: bins(cli)?,
        agent_args,
        in_process_api: false,
        stack: stack(cli),
        model: cli.model && cli.nodes == 3 && cli.pods == 3,
    })
}

/// The families `--ipv4-only` / `--ipv6-only` narrow the lab to (a lab
/// already up keeps its own: see `Lab::attach`).
fn stack(cli: &Cli) -> Stack {
    match (cli.up.ipv4_only, cli.up.ipv6_only) {
        (true, _) => Stack::Ipv4Only,
        (false, true) => Stack::Ipv6Only,
        (false, false) => Stack::Dual,
    }
}

/// `up`: the lab, with every agent on the datapath and routing asked for.
fn up(cli: &Cli) -> Result<()> {
    let u = &cli.up;
    if u.direct_routing && stack(cli) == Stack::Ipv6Only {
        // The agent routes directly the peers whose IPv4 host IP is on the
        // underlay's subnet; an IPv6-only lab's stay on vxlan6.1, and up
        // would fail its routing check after building everything.
        bail!(
            "--direct-routing with --ipv6-only: the agents route peers directly by their IPv4 \
             host IP, and an IPv6-only lab has none (every peer stays on vxlan6.1)"
        );
    }
    // Ctrl-C while the lab comes up stops it at the next step and removes
    // what was made (Lab::up tears down on any error).
    lab::catch_interrupts();
    let mut args = vec![
        "--datapath".to_string(),
        u.datapath.clone(),
        "--tc-encap".to_string(),
        u.tc_encap.to_string(),
    ];
    if u.direct_routing {
        args.extend(["--direct-routing".to_string(), "true".to_string()]);
    }
    args.extend(u.agent_arg.iter().cloned());
    let mut lab = Lab::up(spec(cli, args)?)?;
    // An agent that cannot run the fast path falls back to the kernel path
    // and still comes up; a lab must not pass that off as the datapath it
    // was asked for, nor overlay routes as direct routing.
    let checked = lab.check_datapath(&u.datapath).and_then(|()| {
        if u.direct_routing {
            lab.check_routing(true)
        } else {
            Ok(())
        }
    });
    let checked = checked.and_then(|()| {
        if u.prometheus {
            lab.start_prometheus(
                &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/monitoring"),
            )
        } else {
            Ok(())
        }
    });
    if let Err(e) = checked {
        lab.down();
        return Err(e.context("lab up failed; the lab was removed"));
    }
    let families: Vec<&str> = lab
        .spec
        .stack
        .families()
        .iter()
        .map(|f| f.label())
        .collect();
    println!(
        "lab up: {} nodes x {} pods, {}",
        cli.nodes,
        cli.pods,
        families.join(" and ")
    );
    print!("{}", lab.status()?);
    println!(
        "kubectl from the host: KUBECONFIG={} {}",
        lab.spec.host_kubeconfig().display(),
        lab::HOST_KUBECONFIG_HINT
    );
    if u.prometheus {
        // curl reads the brackets of an IPv6 URL as a glob without -g.
        let curl = if lab.spec.api_addr().is_ipv6() {
            "curl -gs"
        } else {
            "curl -s"
        };
        println!(
            "prometheus: {} scrapes all {} agents (every target up); from the host: ip netns exec {} {curl} '{}/api/v1/query?query=mycni_ready'",
            lab.prometheus_url(),
            cli.nodes,
            lab.spec.underlay_ns(),
            lab.prometheus_url()
        );
    }
    Ok(())
}

/// `test`: the connectivity matrix of a running lab and its datapath report.
fn test(cli: &Cli) -> Result<()> {
    let lab = Lab::attach(spec(cli, vec![])?);
    let t0 = std::time::Instant::now();
    let run = lab.matrix_counted()?;
    let took = t0.elapsed();
    let families: Vec<&str> = run.families.iter().map(|f| f.label()).collect();
    println!(
        "connectivity over {} (ping / TCP round trip / {} KB echo over that connection, per family), rows = source, columns = destination pod:",
        families.join(" and "),
        lab::MATRIX_BULK_BYTES / 1024
    );
    print!("{}", run.table);
    let pods: Vec<String> = lab
        .pods()?
        .iter()
        .map(|p| format!("{} {}", lab::pod_label(p), p.addresses()))
        .collect();
    println!("pods: {}", pods.join(", "));
    println!("matrix took {:.1} s", took.as_secs_f64());
    print!("{}", lab.datapath_report(&run));
    let failed = run.failed;
    if failed > 0 {
        bail!("{failed} source/destination pairs unreachable");
    }
    println!("all pairs reachable");
    Ok(())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match &cli.cmd {
        // The README's main job: a lab that is up and proven reachable.
        None => {
            up(&cli)?;
            test(&cli)?;
            let lab = Lab::attach(spec(&cli, vec![])?);
            if lab.spec.model {
                policy_demo(&lab)?;
            }
            Ok(())
        }
        Some(Cmd::Pod { cmd }) => {
            let lab = Lab::attach(spec(&cli, vec![])?);
            match cmd {
                PodCmd::Add(add) => pod_add(&lab, add),
                PodCmd::Delete { namespace, name } => {
                    lab.delete_kube_pod(namespace, name)?;
                    println!("pod {namespace}/{name} deleted");
                    Ok(())
                }
            }
        }
        Some(Cmd::Netpol { only }) => {
            let lab = Lab::attach(spec(&cli, vec![])?);
            lab::catch_interrupts();
            let reports = lab.run_netpol_suite(only, &mut |_, _, _| Ok(()))?;
            let failed: Vec<&str> = reports
                .iter()
                .filter(|r| !r.passed())
                .map(|r| r.name.as_str())
                .collect();
            if !failed.is_empty() {
                bail!("{} cases failed: {}", failed.len(), failed.join("; "));
            }
            Ok(())
        }
        Some(Cmd::Table { node_rows }) => table(&Lab::attach(spec(&cli, vec![])?), *node_rows),
        Some(Cmd::Serve { ports }) => {
            let ports = ports
                .iter()
                .map(|p| lab::probe::parse_port_proto(p))
                .collect::<Result<Vec<_>>>()?;
            lab::probe::serve(&ports)
        }
        Some(Cmd::Probe { timeout_ms }) => {
            lab::probe::probe_command(std::time::Duration::from_millis(*timeout_ms))
        }
        Some(Cmd::Forward {
            netns,
            to,
            port_file,
        }) => lab::forward_command(netns, *to, port_file),
        Some(Cmd::Up) => up(&cli),
        Some(Cmd::Test) => test(&cli),
        Some(Cmd::Status) => {
            print!("{}", Lab::attach(spec(&cli, vec![])?).status()?);
            Ok(())
        }
        Some(Cmd::Down) => {
            Lab::attach(spec(&cli, vec![])?).down();
            println!("lab down");
            Ok(())
        }
        Some(Cmd::Bench {
            runs,
            seconds,
            services,
            synthetic_rules,
            pin_cpu,
            out,
        }) => {
            if cli.root.is_some() {
                bail!("bench uses its own lab in {}", labbench::ROOT);
            }
            let pin_cpu = match pin_cpu.as_str() {
                "none" => None,
                c => Some(c.parse().context("--pin-cpu: a CPU number or `none`")?),
            };
            let opts = labbench::Options {
                runs: *runs,
                seconds: *seconds,
                services: *services,
                synthetic_rules: *synthetic_rules,
                pin_cpu,
                out: out.clone(),
            };
            labbench::run(bins(&cli)?, &opts)
        }
        Some(Cmd::Soak { out, only }) => {
            if cli.root.is_some() {
                bail!("soak uses its own labs in {SOAK_ROOT}");
            }
            let t0 = std::time::Instant::now();
            let bins = bins(&cli)?;
            let root = std::path::Path::new(SOAK_ROOT);
            watch_soak_interrupts(bins.clone(), root);
            let rows = soak::run_all(&bins, root, soak::Scale::FULL, only);
            let table = soak::table(&rows);
            println!("{table}");
            println!("soak finished in {} s", t0.elapsed().as_secs());
            if let Some(o) = out {
                std::fs::write(o, &table).with_context(|| format!("writing {}", o.display()))?;
            }
            let bad: Vec<&str> = rows
                .iter()
                .filter(|r| r.leaks > 0)
                .map(|r| r.case.as_str())
                .collect();
            if !bad.is_empty() {
                bail!("soak cases with leaks or failures: {}", bad.join(", "));
            }
            Ok(())
        }
        Some(Cmd::EchoServer { port }) => lab::echo_server(*port),
        Some(Cmd::TcpProbe { addr, bulk }) => match lab::tcp_probe(addr, *bulk) {
            Ok(()) => Ok(()),
            Err(lab::ProbeError::RoundTrip(e)) => Err(e),
            Err(lab::ProbeError::Bulk(e)) => {
                // Its own status, so the matrix tells a broken connection
                // from one that only fails with full-size segments.
                eprintln!("Error: {e:#}");
                std::process::exit(lab::PROBE_BULK_FAILED);
            }
        },
        Some(Cmd::TcpRr {
            addr,
            seconds,
            size,
        }) => {
            let (p50, p99, n) = lab::tcp_rr(addr, *seconds, *size)?;
            println!("{}", lab::format_tcp_rr(p50, p99, n));
            Ok(())
        }
        Some(Cmd::TcpCrr { addr, seconds }) => {
            let c = labbench::policy::tcp_crr(addr, *seconds)?;
            println!("{}", labbench::policy::format_crr(&c));
            Ok(())
        }
        Some(Cmd::HttpGet { addr, path }) => {
            println!("{}", lab::http_get(addr, path)?);
            Ok(())
        }
    }
}
