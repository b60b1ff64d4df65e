#include "model/text_stream.h"

#include <algorithm>

#include "core/utf8.h"

namespace pyspec {

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
