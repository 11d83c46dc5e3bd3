#pragma once
// The one error type of the Jinja interpreter: a syntax error, a failed operation while
// rendering, an exceeded limit, or the template's own raise_exception(). The message names the
// template, the line and the column; detail() is the bare message (for raise_exception, exactly
// the text the template passed, so a server can show the template author's words).
#include <string>

#include "core/error.h"

namespace fl::jinja {

class TemplateError : public fl::Error {
 public:
  TemplateError(const std::string& template_name, int line, int column, std::string detail, bool raised_by_template);

  int line() const { return line_; }
  int column() const { return column_; }
  const std::string& detail() const { return detail_; }
  // True when the template called raise_exception() (e.g. roles out of order).
  bool raised_by_template() const { return raised_; }

 private:
  int line_, column_;
  std::string detail_;
  bool raised_;
};

}  // namespace fl::jinja
