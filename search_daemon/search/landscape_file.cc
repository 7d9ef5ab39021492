#include "search_daemon/search/landscape_file.h"

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace kforge::search {

namespace {

std::string one_line(std::string s) {
  for (char& c : s) {
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

}  // namespace

StatusOr<LandscapeFile> LandscapeFile::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status(StatusCode::kNotFound, "cannot read the landscape file " + path);
  LandscapeFile r;
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty() || line[0] == '#') {
      if (line.rfind("# arch\t", 0) == 0) r.arch = line.substr(7);
      if (line.rfind("# device\t", 0) == 0) r.device = line.substr(9);
      continue;
    }
    std::vector<std::string> f;   // empty fields kept
    for (size_t at = 0;;) {
      const size_t tab = line.find('\t', at);
      f.push_back(line.substr(at, tab == std::string::npos ? std::string::npos : tab - at));
      if (tab == std::string::npos) break;
      at = tab + 1;
    }
    const std::string where = path + ":" + std::to_string(n) + ": ";
    if (f.size() != 8) {
      return Status(StatusCode::kInvalidArgument, where + "expected 8 tab-separated fields, got " + std::to_string(f.size()));
    }
    Outcome o;
    try {
      size_t used = 0;
      const int status = std::stoi(f[2], &used);
      if (used != f[2].size() || status < 0 || status > static_cast<int>(eval::EvalStatus::kWorkerError)) {
        throw std::invalid_argument("status");
      }
      o.status = static_cast<eval::EvalStatus>(status);
      o.speedup = std::stod(f[4]);
      o.noise_band = std::stod(f[5]);
    } catch (const std::exception&) {
      return Status(StatusCode::kInvalidArgument, where + "a status, speedup or noise band that is not a number");
    }
    if (f[6] != "0" && f[6] != "1") return Status(StatusCode::kInvalidArgument, where + "significant is neither 0 nor 1");
    o.significant = f[6] == "1";
    o.implausible = f[7];
    r.outcomes[{f[0], f[1]}] = std::move(o);
  }
  if (r.outcomes.empty()) return Status(StatusCode::kInvalidArgument, "the landscape file " + path + " has no outcomes");
  return r;
}

std::vector<std::string> LandscapeFile::labels(const std::string& signature) const {
  std::vector<std::string> out;
  for (auto it = outcomes.lower_bound({signature, ""}); it != outcomes.end() && it->first.first == signature; ++it) {
    out.push_back(it->first.second);
  }
  return out;
}

std::string LandscapeFile::line(const std::string& signature, const std::string& label, const Outcome& o) {
  std::ostringstream s;
  s << one_line(signature) << '\t' << one_line(label) << '\t' << static_cast<int>(o.status) << '\t'
    << eval::eval_status_name(o.status) << '\t' << o.speedup << '\t' << o.noise_band << '\t' << (o.significant ? 1 : 0)
    << '\t' << one_line(o.implausible) << '\n';
  return s.str();
}

}  // namespace kforge::search
