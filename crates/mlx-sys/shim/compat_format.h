/* Force-included into mlx-c's C++ sources. GCC 12's libstdc++ has no
 * std::format, which mlx-c's private io.h uses with plain `{}` placeholders
 * only. This supplies exactly that subset when the library lacks it. */
#ifndef MLX_SPEC_COMPAT_FORMAT_H
#define MLX_SPEC_COMPAT_FORMAT_H
#ifdef __cplusplus
#include <version>
#if !defined(__cpp_lib_format)
#include <sstream>
#include <string>
#include <string_view>

namespace std {
namespace mlx_spec_compat {
inline void format_into(std::ostringstream& out, std::string_view fmt) {
  out << fmt;
}
template <class T, class... Rest>
void format_into(std::ostringstream& out, std::string_view fmt, const T& value,
                 const Rest&... rest) {
  const auto at = fmt.find("{}");
  if (at == std::string_view::npos) {
    out << fmt;
    return;
  }
  out << fmt.substr(0, at) << value;
  format_into(out, fmt.substr(at + 2), rest...);
}
}  // namespace mlx_spec_compat

template <class... Args>
std::string format(std::string_view fmt, const Args&... args) {
  std::ostringstream out;
  mlx_spec_compat::format_into(out, fmt, args...);
  return out.str();
}
}  // namespace std
#endif
#endif
#endif
