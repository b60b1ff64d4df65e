#include "core/utf8.h"

#include <algorithm>

namespace pyspec {

namespace {

// Expected length of a UTF-8 sequence from its lead byte; 0 for a continuation
// or invalid lead byte.
size_t utf8_seq_len(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return 2;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return 4;
    return 0;
}

// The length of the complete UTF-8 sequence at s[i] (0: none there).
size_t valid_length(const std::string& s, size_t i) {
    const size_t len = utf8_seq_len(static_cast<unsigned char>(s[i]));
    if (len == 0 || i + len > s.size()) return 0;
    for (size_t k = 1; k < len; ++k) {
        if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
    }
    return len;
}

}  // namespace

size_t utf8_complete_prefix(const std::string& s) {
    // Look back at most 3 bytes for the start of an unfinished character.
    const size_t n = s.size();
    for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
        const unsigned char c = static_cast<unsigned char>(s[n - back]);
        if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking
        const size_t need = utf8_seq_len(c);
        return (need > back) ? n - back : n;
    }
    return n;
}

std::string utf8_sanitize(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        const size_t len = valid_length(s, i);
        if (len > 0) {
            out.append(s, i, len);
            i += len;
        } else {
            out += "\xEF\xBF\xBD";
            ++i;
        }
    }
    return out;
}

bool is_utf8(const std::string& s) {
    for (size_t i = 0; i < s.size();) {
        const size_t len = valid_length(s, i);
        if (len == 0) return false;
        i += len;
    }
    return true;
}

}  // namespace pyspec
