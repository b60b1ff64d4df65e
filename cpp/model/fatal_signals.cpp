#include "model/fatal_signals.h"

#include <csignal>
#include <cstring>

#include <unistd.h>

namespace pyspec {
namespace {

struct Notice {
    int sig;
    const char* line;  // written as is: only async-signal-safe calls in the handler
    struct sigaction previous;
};

Notice g_notices[] = {
    {SIGILL,
     "pyspec: fatal SIGILL (illegal instruction): this CPU refused an instruction that llama.cpp's kernels "
     "were built for (AMX or AVX-512 inside a VM are the usual ones). `pyspec info` shows what the build "
     "uses and what the CPU allows (docs/cli.md#cpu-features).\n",
     {}},
    {SIGSEGV,
     "pyspec: fatal SIGSEGV (invalid memory access) in native code: a model file changed while loaded, "
     "memory exhausted, or a bug. `pyspec info` shows the build; please report it with the command that "
     "died.\n",
     {}},
    {SIGBUS,
     "pyspec: fatal SIGBUS: a memory-mapped model file was truncated or replaced while in use (or its disk "
     "failed). Reload it: `pyspec models list` verifies the default models, `pyspec info` shows "
     "the build.\n",
     {}},
    {SIGFPE,
     "pyspec: fatal SIGFPE (arithmetic fault) in native code: most often a malformed model file. `pyspec "
     "info` shows the build; please report it with the command that died.\n",
     {}},
};
bool g_installed = false;

void on_fatal(int sig) {
    for (Notice& n : g_notices) {
        if (n.sig != sig) continue;
        ssize_t ignored = write(STDERR_FILENO, n.line, std::strlen(n.line));
        (void)ignored;
        // The signal is blocked while this runs: raised now, it reaches the
        // previous handler when this returns (a fault would also recur there).
        sigaction(sig, &n.previous, nullptr);
        raise(sig);
        return;
    }
}

}  // namespace

void install_fatal_signal_notice() {
    if (g_installed) return;
    g_installed = true;
    for (Notice& n : g_notices) {
        struct sigaction action;
        std::memset(&action, 0, sizeof(action));
        action.sa_handler = on_fatal;
        sigemptyset(&action.sa_mask);
        sigaction(n.sig, &action, &n.previous);
    }
}

}  // namespace pyspec
