// Guarded file mappings: a model file truncated while it is mapped gives an error naming
// the file, never SIGBUS (issue 28, item 3). LayerStream may run inside someone else's
// process (ComfyUI's server, with the user's queue), where a signal would kill it all.
//
// How: SafetensorsReader::open registers each mapping here; the first registration
// installs a SIGBUS handler (SA_SIGINFO, chained to the previous handler for every fault
// outside a registered mapping). A fault inside one -- a page past the file's new end --
// maps anonymous zero pages over the rest of that mapping (so the access completes and
// later ones do not fault) and marks the mapping damaged. The computation then reads
// zeros; check_mapped_files(), called where results leave LayerStream (every denoise /
// generate call, merge-lora before it publishes, info --check), turns the mark into an
// ErrorCode::io naming the file, so nothing computed from the vanished bytes is
// returned. The mark stays until the reader is destroyed (a damaged reader stays
// refused). Costs nothing at load (no copy; one registration per file).
#pragma once

#include <cstddef>
#include <string>

#include "core/status.h"

namespace ls::io {

// Registers [base, base + size) as the mapping of `path` (at most 4096 at once; beyond
// that a mapping is left unguarded and ok is returned). `path` is copied.
void guard_mapping(const void* base, size_t size, const std::string& path);
// Unregisters the mapping starting at `base` (before it is unmapped).
void unguard_mapping(const void* base);
// An error naming the first registered file whose mapping faulted (truncated or
// replaced in place on disk while in use); ok when none did.
Status check_mapped_files();

}  // namespace ls::io
