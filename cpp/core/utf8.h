// UTF-8 checks shared by the text stream (pieces handed out as text) and the
// model (token texts and names from a GGUF file, which llama.cpp does not check).
#pragma once

#include <cstddef>
#include <string>

namespace pyspec {

// Length of the longest prefix of s that ends on a complete UTF-8 character.
size_t utf8_complete_prefix(const std::string& s);
// s with each byte that starts no valid UTF-8 sequence replaced by U+FFFD.
std::string utf8_sanitize(const std::string& s);
// Whether s is valid UTF-8 throughout.
bool is_utf8(const std::string& s);

}  // namespace pyspec
