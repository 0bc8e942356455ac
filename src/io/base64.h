// Standard base64 (RFC 4648, '=' padding): images in JSON answers (`kiln serve`'s b64_json).
// The decoder beside it is tokenizers/precompiled_charsmap.h's, which reads tokenizer.json.
#pragma once
#include <string>
#include <string_view>

namespace kiln::io {

std::string base64_encode(std::string_view bytes);

}  // namespace kiln::io
