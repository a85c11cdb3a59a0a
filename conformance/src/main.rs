//! `attn-conform`: verify case files against the float64 reference, run the fixture suite,
//! list the ops and their contracts, report conformance per implementation. The logic lives in
//! `attn_conformance::app`.

use attn_conformance::app::{self, Io};
use attn_conformance::fixtures::FIXTURES_HELP;
use attn_conformance::report::Format;
use attn_conformance::verify::Selection;
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "attn-conform",
    version,
    about = "Conformance checks for attention kernels"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum DeviceArg {
    Cpu,
    Gpu,
    All,
}

impl From<DeviceArg> for Selection {
    fn from(d: DeviceArg) -> Self {
        match d {
            DeviceArg::Cpu => Selection::Cpu,
            DeviceArg::Gpu => Selection::Gpu,
            DeviceArg::All => Selection::All,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Check case files (or folders of them) against the float64 CPU reference.
    Verify {
        /// cpu (the default): the cases' stored outputs; all: also the GPU kernels where an op
        /// has one and a GPU answers; gpu: as all, but a missing GPU is an error (exit 2).
        #[arg(long, value_enum)]
        device: Option<DeviceArg>,
        /// Also run the context-parallel path over GPUs 0..N of this host (NCCL; N >= 1) for
        /// the ops that have one (chunk_gated_delta_rule_fwd_h, kda_fwd, gdn_fwd): each case's
        /// tokens are partitioned by chunks over the N GPUs (cut at any chunk boundary, so
        /// short sequences cross GPUs too), scattered, run and gathered, and compared with the
        /// float64 reference at the op's thresholds (rows with device gpus=N). Cases of other
        /// ops are reported skipped; N above the GPU count, or no NCCL library, is an error
        /// (exit 2), as is a run where no case had a context-parallel path.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        gpus: Option<u32>,
        /// Write the rows as a JSON array to stdout (the summary line goes to stderr).
        #[arg(long)]
        json: bool,
        /// Also write the float64 reference outputs of every case, as a case file
        /// DIR/OP/NAME (the case's op and file name; same inputs and parameters), for diffing.
        #[arg(long, value_name = "DIR")]
        dump_reference: Option<PathBuf>,
        #[arg(required = true, value_name = "FILE_OR_DIR")]
        paths: Vec<PathBuf>,
    },
    /// Verify every case under the fixtures folder, one summary row per (op, device).
    Run {
        #[arg(long, value_name = "DIR", help = FIXTURES_HELP)]
        fixtures: Option<PathBuf>,
        /// all (the default): the cases' stored outputs, and the GPU kernels where an op has
        /// one and a GPU answers; cpu: the stored outputs only; gpu: as all, but a missing GPU
        /// is an error (exit 2).
        #[arg(long, value_enum)]
        device: Option<DeviceArg>,
        /// Write the summary rows as a JSON array to stdout (the summary line goes to stderr).
        #[arg(long)]
        json: bool,
    },
    /// List the ops with their inputs' and outputs' shapes and dtypes, parameters, devices and
    /// spec sections; with OP, that op's whole contract.
    List {
        /// One op id (e.g. chunk_gated_delta_rule_fwd_h).
        #[arg(value_name = "OP")]
        op: Option<String>,
        /// Write the listing as JSON to stdout (what attn_conform.ops() returns).
        #[arg(long)]
        json: bool,
    },
    /// Per upstream implementation (each case's source.impl) and op: cases passed, failed and
    /// unusable, and the worst ratio against its threshold (stored outputs only).
    Report {
        #[arg(value_name = "DIR", help = FIXTURES_HELP)]
        dir: Option<PathBuf>,
        /// Write a GitHub markdown table.
        #[arg(long, conflicts_with = "html")]
        markdown: bool,
        /// Write a standalone HTML page.
        #[arg(long)]
        html: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr());
    let mut io = Io {
        out: &mut out,
        err: &mut err,
    };
    ExitCode::from(match cli.command {
        Command::Verify {
            device,
            gpus,
            json,
            dump_reference,
            paths,
        } => app::verify(
            &paths,
            device.map(Selection::from),
            gpus.map(|n| n as usize),
            json,
            dump_reference.as_deref(),
            &mut io,
        ),
        Command::Run {
            fixtures,
            device,
            json,
        } => app::run(
            fixtures.as_deref(),
            device.map(Selection::from),
            json,
            &mut io,
        ),
        Command::List { op, json } => app::list(op.as_deref(), json, &mut io),
        Command::Report {
            dir,
            markdown,
            html,
        } => {
            let format = match (markdown, html) {
                (true, _) => Format::Markdown,
                (_, true) => Format::Html,
                _ => Format::Text,
            };
            app::report(dir.as_deref(), format, &mut io)
        }
    })
}
