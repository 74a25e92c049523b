/* The one import wine 8.0 lacks for Rust programs (std imports ProcessPrng from
   bcryptprimitives.dll since Rust 1.78): supplied from BCryptGenRandom. Built by .ci/run
   and put beside the test's Windows binaries; it belongs to the test harness only, never
   to a package a user installs (real Windows 10 and 11 have the DLL). */
#include <windows.h>
#include <bcrypt.h>
__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE p, SIZE_T n) {
  return BCryptGenRandom(NULL, p, (ULONG)n, BCRYPT_USE_SYSTEM_PREFERRED_RNG) == 0;
}
