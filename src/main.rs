fn main() {
    std::process::exit(larch::cli::main());
}
