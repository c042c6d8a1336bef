// Files an operator names (a secret, a command file, an output directory),
// checked before they are used: a FIFO would block the open for ever, a
// device such as /dev/zero or a huge file would exhaust memory when read
// whole, and a directory would read as an empty file.
#pragma once

#include <cstddef>
#include <string>

namespace dblp {

// Reads `path` whole when it is a regular file of at most `max_bytes`.
// Opened O_NONBLOCK (a FIFO cannot block) and checked with fstat on the
// open descriptor (a rename in between cannot swap in something else).
// false with *error saying what it is instead ("a FIFO", "a directory",
// "N bytes, more than ...") or why it cannot be read.
bool ReadRegularFile(const std::string& path, size_t max_bytes,
                     std::string* text, std::string* error);

// "" when `path` can be written as a regular file: absent, or a regular
// file; else what it is instead (a FIFO would block the writer).
std::string CheckWritableFilePath(const std::string& path);

// "" when `path` is a directory or absent (it will be made); else what it
// is instead.
std::string CheckDirectoryPath(const std::string& path);

// "" when `path` exists and is a directory; else what it is instead.
std::string CheckExistingDirectory(const std::string& path);

}  // namespace dblp
