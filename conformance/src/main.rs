//! `attn-conform`: verify case files against the float64 reference, run the fixture suite,
//! list the ops. The logic lives in `attn_conformance::app`.

use attn_conformance::app::{self, Io};
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
        /// cpu: the cases' stored outputs; all: also the GPU kernels where an op has one and a
        /// GPU answers; gpu: as all, but a missing GPU is an error (exit 2).
        #[arg(long, value_enum, default_value = "cpu")]
        device: DeviceArg,
        /// Write the rows as a JSON array to stdout.
        #[arg(long)]
        json: bool,
        /// Also write the float64 reference outputs of every case, as a case file
        /// DIR/<op>/<file name> (same inputs and parameters), for diffing.
        #[arg(long, value_name = "DIR")]
        dump_reference: Option<PathBuf>,
        #[arg(required = true, value_name = "FILE_OR_DIR")]
        paths: Vec<PathBuf>,
    },
    /// Verify every case under the fixtures folder, one summary row per (op, device).
    Run {
        /// The fixtures folder (default: $ATTN_FIXTURES, $CARGO_MANIFEST_DIR/../fixtures, ./fixtures).
        #[arg(long)]
        fixtures: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "all")]
        device: DeviceArg,
        #[arg(long)]
        json: bool,
    },
    /// List the ops, their inputs and parameters, and the devices that implement them.
    List {
        #[arg(long)]
        json: bool,
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
            json,
            dump_reference,
            paths,
        } => app::verify(
            &paths,
            device.into(),
            json,
            dump_reference.as_deref(),
            &mut io,
        ),
        Command::Run {
            fixtures,
            device,
            json,
        } => app::run(fixtures.as_deref(), device.into(), json, &mut io),
        Command::List { json } => app::list(json, &mut io),
    })
}
