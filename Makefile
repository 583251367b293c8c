# Builds cpuprof and installs it for C and C++ programs, in the layout gperftools' users know:
#
#   make && sudo make install                          # into PREFIX=/usr/local
#   make install PREFIX=/opt/cpuprof DESTDIR=/tmp/stage # staged, as packagers do
#   sudo make uninstall
#
# installs
#   $(LIBDIR)/libcpuprof.so.$(VERSION), with the links libcpuprof.so.$(MAJOR) (its soname, what
#       programs linked with -lcpuprof load) and libcpuprof.so (what -lcpuprof finds)
#   $(LIBDIR)/libcpuprof.a                 static linking (README.md, "Installing (C and C++)")
#   $(LIBDIR)/pkgconfig/cpuprof.pc         pkg-config --cflags --libs cpuprof
#   $(INCLUDEDIR)/gperftools/profiler.h, $(INCLUDEDIR)/gperftools/heap-profiler.h,
#   $(INCLUDEDIR)/cpuprof.h
#   $(BINDIR)/cpuprof                      `cpuprof record` preloads ../lib/libcpuprof.so from
#                                          there (another LIBDIR: set CPUPROF_LIB)
#
# `make` always has cargo bring the build up to date; `make install` builds only if a file is
# missing, so that it runs as root without cargo. PROFILE=dev installs the debug build
# (tests/install.rs), BUILD_DIR names the directory of an existing build directly.

PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig

CARGO ?= cargo
# Run after a real install as root, so that the loader's cache knows the new library (without
# it, a program linked with -lcpuprof would not find libcpuprof.so.$(MAJOR) in /usr/local/lib).
LDCONFIG ?= ldconfig
PROFILE ?= release
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
# cargo's dev profile builds into target/debug.
BUILD_DIR ?= $(TARGET_DIR)/$(if $(filter dev,$(PROFILE)),debug,$(PROFILE))

# The library's version, from its crate; the soname (cdylib/build.rs) carries the major part.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' cdylib/Cargo.toml)
MAJOR := $(firstword $(subst ., ,$(VERSION)))

RUN_LDCONFIG := if [ -z '$(DESTDIR)' ] && [ "$$(id -u)" = 0 ] && command -v $(LDCONFIG) >/dev/null; then $(LDCONFIG); fi
BUILT := $(BUILD_DIR)/libcpuprof.so $(BUILD_DIR)/libcpuprof.a $(BUILD_DIR)/cpuprof
CARGO_BUILD := $(CARGO) build --profile $(PROFILE) -p cpuprof-preload -p cpuprof-cli

.PHONY: all install uninstall

# The soname link beside the build too, so that a program linked with -L$(BUILD_DIR) -lcpuprof
# runs with LD_LIBRARY_PATH=$(BUILD_DIR).
all:
	$(CARGO_BUILD)
	ln -sf libcpuprof.so '$(BUILD_DIR)/libcpuprof.so.$(MAJOR)'

install:
	$(foreach f,$(BUILT),test -f '$(f)' &&) true || $(CARGO_BUILD)
	install -D -m 755 '$(BUILD_DIR)/libcpuprof.so' '$(DESTDIR)$(LIBDIR)/libcpuprof.so.$(VERSION)'
	ln -sf libcpuprof.so.$(VERSION) '$(DESTDIR)$(LIBDIR)/libcpuprof.so.$(MAJOR)'
	ln -sf libcpuprof.so.$(MAJOR) '$(DESTDIR)$(LIBDIR)/libcpuprof.so'
	install -D -m 644 '$(BUILD_DIR)/libcpuprof.a' '$(DESTDIR)$(LIBDIR)/libcpuprof.a'
	install -D -m 644 include/gperftools/profiler.h '$(DESTDIR)$(INCLUDEDIR)/gperftools/profiler.h'
	install -D -m 644 include/gperftools/heap-profiler.h '$(DESTDIR)$(INCLUDEDIR)/gperftools/heap-profiler.h'
	install -D -m 644 include/cpuprof.h '$(DESTDIR)$(INCLUDEDIR)/cpuprof.h'
	install -D -m 755 '$(BUILD_DIR)/cpuprof' '$(DESTDIR)$(BINDIR)/cpuprof'
	install -d '$(DESTDIR)$(PKGCONFIGDIR)'
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' \
	    -e 's|@VERSION@|$(VERSION)|g' cpuprof.pc.in > '$(DESTDIR)$(PKGCONFIGDIR)/cpuprof.pc'
	chmod 644 '$(DESTDIR)$(PKGCONFIGDIR)/cpuprof.pc'
	$(RUN_LDCONFIG)

uninstall:
	rm -f '$(DESTDIR)$(LIBDIR)/libcpuprof.so.$(VERSION)' '$(DESTDIR)$(LIBDIR)/libcpuprof.so.$(MAJOR)' \
	    '$(DESTDIR)$(LIBDIR)/libcpuprof.so' '$(DESTDIR)$(LIBDIR)/libcpuprof.a' \
	    '$(DESTDIR)$(PKGCONFIGDIR)/cpuprof.pc' '$(DESTDIR)$(INCLUDEDIR)/gperftools/profiler.h' \
	    '$(DESTDIR)$(INCLUDEDIR)/gperftools/heap-profiler.h' '$(DESTDIR)$(INCLUDEDIR)/cpuprof.h' '$(DESTDIR)$(BINDIR)/cpuprof'
	rmdir '$(DESTDIR)$(INCLUDEDIR)/gperftools' 2>/dev/null || true
	$(RUN_LDCONFIG)
