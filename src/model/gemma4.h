#pragma once
#include <memory>

#include "model/model.h"

namespace fl {
std::unique_ptr<Model> make_gemma4_model(const ModelSource& source, Backend& backend);
}
