// Turns a stream of token pieces (raw bytes) into text that is safe to hand out:
// never splits a UTF-8 character, never emits text that may turn out to be the
// start of a stop string, and cuts the output at the first stop string.
#pragma once

#include <string>
#include <vector>

namespace pyspec {

class TextStream {
public:
    explicit TextStream(std::vector<std::string> stops = {});

    // Append one token's bytes. Returns the text that became safe to emit.
    std::string push(const std::string& piece);
    // End of generation: the rest of the held-back text (invalid UTF-8 replaced).
    std::string finish();

    bool stopped() const { return stopped_; }      // a stop string was found
    const std::string& text() const { return text_; }  // everything emitted so far

private:
    std::vector<std::string> stops_;
    size_t max_stop_ = 0;
    std::string text_;      // emitted
    std::string pending_;   // held back
    bool stopped_ = false;
};

}  // namespace pyspec
