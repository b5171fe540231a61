#pragma once
// The one dispatch point of the ops: run(p, ctx) routes the params struct of any op family to
// its run_cpu or run_cuda by ctx.device (pointers in p must live on that device). Routing only:
// an op without a CUDA implementation, or any op on CUDA in a build without the backend, throws
// hyserve::error naming the op; nothing falls back to another device.
// Instantiated in kernels/dispatch.cpp for every params struct (adding an op family adds a
// line there).
#include "hyserve/kernels/device.h"

namespace hyserve::kernels {

template <class Params>
void run(const Params& p, const exec_context& ctx);

// True when run(p, ctx) with ctx.device = kCuda has an implementation for Params in this build.
template <class Params>
bool has_cuda();

}  // namespace hyserve::kernels
