// The sections of a DeepSpeed config, each parsed into the Config by its own file: the
// optimizer and scheduler (config_optimizer.cpp), zero_optimization (config_zero.cpp), the
// precision sections (config_precision.cpp). parse_config (config.cpp) calls them in order.
#pragma once

#include <string>
#include <vector>

#include "dtrain/zero_config.h"
#include "zero/config_section.h"

namespace dtrain::zero::config_parse {

void parse_optimizer(Section& root, Config& c);

void parse_scheduler(Section& root, Config& c);

// What DeepSpeed 0.19.8's engine decides about the optimizers and schedulers it builds by name
// from torch.optim, once ZeRO and the precision are known. dtrain runs both where DeepSpeed
// stops, and says so in a note.
void check_by_name_rules(Section& root, Config& c);

// `unused`: the keys given that dtrain reads but does not act on (one note names them all).
void parse_zero(Section& root, Config& c, std::vector<std::string>& unused);

// "data_types": DeepSpeed 0.19.8 reads it with .get() (an unknown key is ignored there) and
// checks each value where its engine uses it: param_dtype always, buffer_dtype and
// keep_in_fp32_modules under fp16/bf16 only, grad_accum_dtype when it builds the optimizer
// (dtrain always has one).
void parse_data_types(Section& root, Config& c);

// "torch_autocast": DeepSpeed 0.19.8 reads it with .get() (runtime/config.py) whether or not it
// is enabled: a dtype its DtypeEnum does not know and modules that are not a list of strings
// are refused; the engine then runs its forward under torch.autocast (torch_autocast.py,
// autocast_if_enabled); at stages 1-3 it reduces the marked modules' gradients in the autocast
// dtype (at stage 3 it all-gathers their parameters so too, which changes nothing their
// autocast ops compute). With fp16 it scales the loss with torch.amp.GradScaler (the engine's
// AmpGradScaler); fp16 over 16-bit parameters is refused.
void parse_torch_autocast(Section& root, Config& c);

// DeepSpeed 0.19.8's get_communication_data_type: "fp32", "fp16" or "bf16" in any case; null is
// its default (the model's dtype); anything else it refuses. The engine reads it from the raw
// config (communication_data_type()).
void parse_communication_data_type(Section& root, const Config& c);

}  // namespace dtrain::zero::config_parse
