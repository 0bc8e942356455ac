// NVRTC and cuBLASLt, loaded when the CUDA device first needs them rather than linked: a kiln
// binary built with the CUDA backend starts as fast as one without (cuBLASLt alone is a 540 MB
// library), and a machine that lacks them gets an error naming the file, not a binary that does
// not start. The CUDA runtime itself is linked statically (it loads the driver the same way).
#pragma once
#include <cublasLt.h>
#include <nvrtc.h>

namespace kiln::cuda {

struct NvrtcLibrary {
  decltype(&::nvrtcVersion) Version;
  decltype(&::nvrtcGetErrorString) GetErrorString;
  decltype(&::nvrtcCreateProgram) CreateProgram;
  decltype(&::nvrtcDestroyProgram) DestroyProgram;
  decltype(&::nvrtcCompileProgram) CompileProgram;
  decltype(&::nvrtcGetProgramLogSize) GetProgramLogSize;
  decltype(&::nvrtcGetProgramLog) GetProgramLog;
  decltype(&::nvrtcGetPTXSize) GetPTXSize;
  decltype(&::nvrtcGetPTX) GetPTX;
  decltype(&::nvrtcGetCUBINSize) GetCUBINSize;
  decltype(&::nvrtcGetCUBIN) GetCUBIN;
};

struct CublasLtLibrary {
  decltype(&::cublasLtCreate) Create;
  decltype(&::cublasLtGetStatusName) GetStatusName;
  decltype(&::cublasLtGetStatusString) GetStatusString;
  decltype(&::cublasLtMatmul) Matmul;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
  decltype(&::cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
};

// Loaded on first call (from the library search path, else the toolkit folder found at build
// time); throws "[cuda] cannot load <file>: ..." or "... has no <symbol>".
const NvrtcLibrary& nvrtc();
const CublasLtLibrary& cublaslt();

}  // namespace kiln::cuda
