// Subcommand registry of the `layerstream` CLI. Each cli/cmd_*.cpp registers one
// subcommand with a static LS_REGISTER_COMMAND; main.cpp builds the CLI11 app from
// the registry. A command's setup adds its options to `sub` and returns the function
// that runs it (exit code).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace ls::cli {

using CommandRun = std::function<int()>;
using CommandSetup = std::function<CommandRun(CLI::App& sub)>;

struct CommandInfo {
  std::string name;
  std::string description;
  CommandSetup setup;
};

std::vector<CommandInfo>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::string description, CommandSetup setup) {
    command_registry().push_back({std::move(name), std::move(description), std::move(setup)});
  }
};

}  // namespace ls::cli

#define LS_REGISTER_COMMAND(var, name, description, setup) \
  static ::ls::cli::CommandRegistrar var(name, description, setup)
