// Rows as exact text: numbers as hexadecimal floats, strings length-prefixed, so decoding gives
// back every bit. Used by the journal of `attnscale experiment --out` (a resumed run writes the same
// bytes as one never interrupted) and by the MPI scheduler (rows sent from rank to rank).
#pragma once
#include <string>
#include <vector>

#include "lab/results.h"

namespace attnscale::lab {

std::string encode_rows(const std::vector<Row>& rows);
std::vector<Row> decode_rows(const std::string& text);  // throws Error on a malformed payload

}  // namespace attnscale::lab
