#include "model/text_stream.h"

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
    size_t i = 0;
    while (i < s.size()) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        size_t len = utf8_seq_len(c);
        bool ok = len > 0 && i + len <= s.size();
        for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
        if (ok) {
            out.append(s, i, len);
            i += len;
        } else {
            out += "\xEF\xBF\xBD";
            ++i;
        }
    }
    return out;
}

TextStream::TextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {
    stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
    for (const auto& s : stops_) max_stop_ = std::max(max_stop_, s.size());
}

std::string TextStream::push(const std::string& piece) {
    if (stopped_) return {};
    pending_ += piece;
    // A stop string may straddle already-emitted text only within the held-back
    // window, because we never emit a suffix that could begin a stop string.
    size_t cut = std::string::npos;
    for (const auto& s : stops_) {
        const size_t at = pending_.find(s);
        if (at != std::string::npos) cut = std::min(cut, at);
    }
    if (cut != std::string::npos) {
        std::string out = utf8_sanitize(pending_.substr(0, cut));
        text_ += out;
        pending_.clear();
        stopped_ = true;
        return out;
    }
    size_t safe = utf8_complete_prefix(pending_);
    // Hold back the longest suffix that is a proper prefix of some stop string.
    if (max_stop_ > 0) {
        for (size_t len = std::min(max_stop_ - 1, pending_.size()); len > 0; --len) {
            const size_t start = pending_.size() - len;
            bool is_prefix = false;
            for (const auto& s : stops_) {
                if (s.size() > len && s.compare(0, len, pending_, start, len) == 0) {
                    is_prefix = true;
                    break;
                }
            }
            if (is_prefix) {
                safe = std::min(safe, start);
                break;
            }
        }
    }
    std::string out = pending_.substr(0, safe);
    pending_.erase(0, safe);
    text_ += out;
    return out;
}

std::string TextStream::finish() {
    if (stopped_ || pending_.empty()) return {};
    std::string out = utf8_sanitize(pending_);
    pending_.clear();
    text_ += out;
    return out;
}

}  // namespace pyspec
