#include "dblp/base/file_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dblp {
namespace {

std::string KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

bool ReadRegularFile(const std::string& path, size_t max_bytes,
                     std::string* text, std::string* error) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    *error = std::string("cannot open it: ") + std::strerror(errno);
    return false;
  }
  struct stat st {};
  bool ok = false;
  if (::fstat(fd, &st) != 0) {
    *error = std::string("cannot stat it: ") + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    *error = KindOf(st.st_mode) + ", not a regular file";
  } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    *error = std::to_string(st.st_size) + " bytes, more than the " +
             std::to_string(max_bytes) + " this file may have";
  } else {
    // Reads until EOF, never past the cap: the file may grow meanwhile.
    text->clear();
    char buf[4096];
    ok = true;
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        *error = std::string("cannot read it: ") + std::strerror(errno);
        ok = false;
        break;
      }
      if (n == 0) break;
      if (text->size() + static_cast<size_t>(n) > max_bytes) {
        *error = "grew past " + std::to_string(max_bytes) + " bytes";
        ok = false;
        break;
      }
      text->append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return ok;
}

std::string CheckWritableFilePath(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";  // made when written
  if (S_ISREG(st.st_mode)) return "";
  return KindOf(st.st_mode) + ", not a regular file";
}

std::string CheckDirectoryPath(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";  // made when written
  if (S_ISDIR(st.st_mode)) return "";
  return S_ISREG(st.st_mode) ? "a file, not a directory"
                             : KindOf(st.st_mode) + ", not a directory";
}

std::string CheckExistingDirectory(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return std::string("cannot use it: ") + std::strerror(errno);
  }
  if (S_ISDIR(st.st_mode)) return "";
  return S_ISREG(st.st_mode) ? "a file, not a directory"
                             : KindOf(st.st_mode) + ", not a directory";
}

}  // namespace dblp
