fn main() {
    // As custom-labels' README asks of an executable: export the ABI's symbols dynamically.
    custom_labels::build::emit_build_instructions();
}
