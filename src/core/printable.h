// Text from files made printable before it reaches a terminal or a log (issue 28, item 8).
//
// Error messages quote what hostile files hold (tensor names, metadata keys and values,
// LoRA key names). printable_text() is applied where a message leaves LayerStream (the
// error sinks: the CLI's report_error, the C API's last-error text, which the Python
// package raises), so a control byte in a file can neither retitle a terminal window,
// clear the screen nor hide text: kept are printable ASCII, newline and tab, and valid
// UTF-8 for code points from U+00A0 on except the bidirectional controls (U+202A-202E,
// U+2066-2069) and line/paragraph separators (U+2028-2029); every other byte (C0
// controls, ESC, DEL, the C1 controls U+0080-009F, bytes of invalid UTF-8) becomes
// "\xNN". A backslash stays as it is, so a message the reader already escaped
// (docs/safetensors.md) is not escaped twice; text that is printable comes back unchanged.
#pragma once

#include <string>
#include <string_view>

namespace ls {

std::string printable_text(std::string_view text);

}  // namespace ls
