// How a search names its trials and their directories, as Ray Tune 2.60 names them:
//
//   trial id         "<experiment id>_<index>": Ray's BasicVariantGenerator gives each trial
//                    its uuid_prefix (5 hex characters, random per experiment: uuid1().hex[:5])
//                    and its counter, "%05d"; dtrain draws the 5 characters once per search and
//                    keeps them in tuner_state.json, so a resumed search goes on with them.
//   experiment tag   "<index>_<format_vars>": the values the search space resolved (grid,
//                    random and sample_from values, not constants), sorted by their path, each
//                    "<last key>=<value>", a float as "%.4f", anything else as Python's str()
//                    with every run of characters outside [a-zA-Z0-9_-] made one "_" and "_"
//                    stripped at both ends (variant_generator.py's format_vars, _clean_value).
//   trial name       Ray's str(trial): "<trainable>[_<env>]_<id>" ("<env>" is
//                    str(config["env"]) when the config has that key, as Ray's
//                    _trainable_name), or what TuneOptions::trial_name_creator returned.
//   perturbed tag    PBT's exploit: "<original tag>@perturbed[<format_vars of the mutated
//                    keys' new values>]" (pbt.py's _make_experiment_tag).
//   trial directory  "<name>_<tag>" cut to TUNE_MAX_LEN_IDENTIFIER (default 130) characters,
//                    then "_<date>" (%Y-%m-%d_%H-%M-%S, local time), every character of
//                    /()<>:"\|?* made "_" (Trial._generate_dirname); "_" and 4 random hex
//                    characters appended when that directory exists already
//                    (_create_unique_logdir_name).
//   checkpoints      checkpoint_000000, checkpoint_000001, ... (StorageContext; session.cpp).
//
//     std::string id = trial_id(experiment_id, 3);                   // "4554a_00003"
//     std::string tag = experiment_tag(3, space, config);             // "3_lr=0.0100,width=64"
//     std::string name = trial_name("train_fn", id, config);         // "train_fn_4554a_00003"
//     std::string dir = trial_dirname(name, tag, date_str(), 130);
//
// Thread-safe; pure functions but for new_experiment_id, unique_dirname and date_str.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

#include "dtrain/tune_search_space.h"

namespace dtrain::tune::detail {

// 5 random lower-case hex characters (std::random_device).
std::string new_experiment_id();

// "<experiment_id>_<index as %05d>".
std::string trial_id(const std::string& experiment_id, std::size_t index);

// Ray's format_vars over the values `config` holds where `space` has a grid or a domain.
std::string format_vars(const Config& space, const Config& config);

// Ray's experiment tag of variant `index`: "<index>", and "_<format_vars>" when the space
// resolved anything.
std::string experiment_tag(std::size_t index, const Config& space, const Config& config);

// Ray's str(trial) (Trial._trainable_name(include_trial_id=True)): "<trainable>[_<env>]_<id>",
// "<env>" being str(config["env"]) when the config has that key, every "/" made "_". Ray names
// the trial's MLflow run so (MLflowLoggerCallback's run_name and "trial_name" tag).
std::string trial_name(const std::string& trainable, const std::string& id, const Config& config);

// Ray's _make_experiment_tag: `orig_tag` + "@perturbed[" + format_vars of config[k] for every
// top-level key k of `mutations` + "]" (sorted by key, each "<k>=<value>" as format_vars
// writes it). REQUIRES: `config` holds every key of `mutations`.
std::string perturbed_tag(const std::string& orig_tag, const Config& config,
                          const Config& mutations);

// Ray's Trial._generate_dirname without a trial_dirname_creator, for a trial named `name` (its
// str(trial)). `max_len`: the identifier's length in characters (Unicode code points, as
// Python slices a str).
std::string trial_dirname(const std::string& name, const std::string& tag, const std::string& date,
                          std::size_t max_len);

// The characters Ray replaces in every trial directory name (/()<>:"\|?*) made "_".
std::string sanitize_dirname(const std::string& name);

// `name`, or `name` + "_" + 4 random hex characters when root/name exists.
std::string unique_dirname(const std::filesystem::path& root, const std::string& name);

// Ray's date_str(): now, local time, %Y-%m-%d_%H-%M-%S.
std::string date_str();

}  // namespace dtrain::tune::detail
