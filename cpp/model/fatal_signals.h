// One plain line on stderr when the process dies in native code, instead of the
// shell's bare "Illegal instruction": a CPU that refuses an instruction the
// build uses (AMX or AVX-512 in a VM), a model file cut or replaced while
// mapped, or a bug. The CLI installs it (pyspec/cli/__init__.py); a library
// user's process keeps its own handlers.
#pragma once

namespace pyspec {

// For SIGILL, SIGSEGV, SIGBUS and SIGFPE: write the line, then hand the signal
// to the handler that was there before (Python's faulthandler where enabled,
// else the default, so the process still dies of it: exit status 128 + N).
// Idempotent.
void install_fatal_signal_notice();

}  // namespace pyspec
