// 16-bit floating-point formats: scalar conversions, exact and round-to-nearest-even, the
// specification that vectorised kernels and the wire formats are tested against.
#pragma once
#include <cstdint>
#include <string>

namespace anvil {

// What matrix products compute in (the `precision` config key, config/choices.h): fp32, or fp32
// values rounded to bfloat16 or IEEE half at the inputs and outputs of every matrix product
// (docs/precision.md).
enum class ComputeDtype { kFp32, kBf16, kFp16 };
const char* dtype_name(ComputeDtype d);

// bfloat16: the top 16 bits of a float, rounded to nearest even; NaN stays NaN.
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t h);
// IEEE binary16, rounded to nearest even: |f| >= 65520 becomes infinity, values below 2^-14
// become subnormal (multiples of 2^-24) or zero; NaN stays NaN.
uint16_t float_to_fp16(float f);
float fp16_to_float(uint16_t h);

// A float as a double that prints as the float's shortest decimal (0.1f as 0.1, not
// 0.10000000149011612): how a float option is written to JSON that others read.
double float_as_written(float f);

}  // namespace anvil
