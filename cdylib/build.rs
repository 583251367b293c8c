//! Compiles the C-variadic interposers (src/variadic.c) and the heap sampler's thread-local
//! countdown (src/heap/countdown.c), and gives libcpuprof.so its soname,
//! libcpuprof.so.<major>: a program linked with `-lcpuprof`
//! then records that name (NEEDED), which `make install` provides as a symlink to the
//! versioned file, so a later incompatible release can be installed beside this one.

fn main() {
    cc::Build::new()
        .file("src/variadic.c")
        .file("src/heap/countdown.c")
        .flag("-fvisibility=hidden")
        .warnings(true)
        .compile("cpuprof_variadic");
    println!("cargo:rerun-if-changed=src/variadic.c");
    println!("cargo:rerun-if-changed=src/heap/countdown.c");
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets CARGO_PKG_VERSION_MAJOR");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcpuprof.so.{major}");
    println!("cargo:rerun-if-changed=build.rs");
}
