//! The `strata` binary (see the library's [`strata::main`]).

fn main() -> std::process::ExitCode {
    strata::main()
}
