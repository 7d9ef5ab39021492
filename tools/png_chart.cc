#include "tools/png_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "runtime/file_io.h"

namespace kforge {

namespace {

uint32_t crc32(const std::string& data, size_t begin) {
  static uint32_t table[256];
  static bool init = false;
  if (!init) {
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      table[n] = c;
    }
    init = true;
  }
  uint32_t c = 0xffffffffu;
  for (size_t i = begin; i < data.size(); ++i) c = table[(c ^ static_cast<uint8_t>(data[i])) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

void put_be32(std::string& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out += static_cast<char>((v >> s) & 0xff);
}

void chunk(std::string& png, const char* type, const std::string& data) {
  put_be32(png, static_cast<uint32_t>(data.size()));
  const size_t start = png.size();
  png += type;
  png += data;
  put_be32(png, crc32(png, start));
}

// zlib stream of stored deflate blocks (RFC 1950/1951).
std::string zlib_stored(const std::string& raw) {
  std::string z = "\x78\x01";
  size_t pos = 0;
  do {
    const size_t n = std::min<size_t>(65535, raw.size() - pos);
    const bool final = pos + n == raw.size();
    z += static_cast<char>(final ? 1 : 0);
    z += static_cast<char>(n & 0xff);
    z += static_cast<char>(n >> 8);
    z += static_cast<char>(~n & 0xff);
    z += static_cast<char>((~n >> 8) & 0xff);
    z.append(raw, pos, n);
    pos += n;
  } while (pos < raw.size());
  uint32_t a = 1, b = 0;
  for (unsigned char c : raw) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  put_be32(z, (b << 16) | a);
  return z;
}

// 5x7 glyphs, one row per entry, bit 4 the leftmost pixel.
const std::map<char, std::array<uint8_t, 7>>& font() {
  static const std::map<char, std::array<uint8_t, 7>> f = {
      {'0', {0x0e, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0e}}, {'1', {0x04, 0x0c, 0x04, 0x04, 0x04, 0x04, 0x0e}},
      {'2', {0x0e, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1f}}, {'3', {0x1f, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0e}},
      {'4', {0x02, 0x06, 0x0a, 0x12, 0x1f, 0x02, 0x02}}, {'5', {0x1f, 0x10, 0x1e, 0x01, 0x01, 0x11, 0x0e}},
      {'6', {0x06, 0x08, 0x10, 0x1e, 0x11, 0x11, 0x0e}}, {'7', {0x1f, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
      {'8', {0x0e, 0x11, 0x11, 0x0e, 0x11, 0x11, 0x0e}}, {'9', {0x0e, 0x11, 0x11, 0x0f, 0x01, 0x02, 0x0c}},
      {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0c, 0x0c}}, {'x', {0x00, 0x00, 0x11, 0x0a, 0x04, 0x0a, 0x11}},
      {'m', {0x00, 0x00, 0x1a, 0x15, 0x15, 0x11, 0x11}}, {'i', {0x04, 0x00, 0x0c, 0x04, 0x04, 0x04, 0x0e}},
      {'n', {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11}}, {'s', {0x00, 0x00, 0x0f, 0x10, 0x0e, 0x01, 0x1e}},
      {'-', {0x00, 0x00, 0x00, 0x1f, 0x00, 0x00, 0x00}},
  };
  return f;
}

struct Canvas {
  int w, h;
  std::vector<uint8_t> px;
  Canvas(int width, int height) : w(width), h(height), px(static_cast<size_t>(width) * height, 0) {}
  void set(int x, int y, uint8_t c) {
    if (x >= 0 && y >= 0 && x < w && y < h) px[static_cast<size_t>(y) * w + x] = c;
  }
  void rect(int x0, int y0, int x1, int y1, uint8_t c) {
    for (int y = std::min(y0, y1); y <= std::max(y0, y1); ++y) {
      for (int x = std::min(x0, x1); x <= std::max(x0, x1); ++x) set(x, y, c);
    }
  }
  // Scale-2 text, left edge at x, top at y; unknown characters are skipped as spaces.
  void text(int x, int y, const std::string& s, uint8_t c) {
    for (char ch : s) {
      const auto it = font().find(ch);
      if (it != font().end()) {
        for (int r = 0; r < 7; ++r) {
          for (int col = 0; col < 5; ++col) {
            if (it->second[r] & (0x10 >> col)) rect(x + 2 * col, y + 2 * r, x + 2 * col + 1, y + 2 * r + 1, c);
          }
        }
      }
      x += 12;
    }
  }
};

std::string number(double v) {
  char b[32];
  if (std::fabs(v - std::round(v)) < 1e-9 && std::fabs(v) < 1e6) {
    std::snprintf(b, sizeof b, "%.0f", v);
  } else {
    std::snprintf(b, sizeof b, "%.1f", v);
  }
  return b;
}

double nice_step(double span, int ticks) {
  const double raw = span / ticks;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p >= raw) return m * p;
  }
  return 10 * p;
}

}  // namespace

std::string encode_indexed_png(int width, int height, const std::vector<uint8_t>& pixels,
                               const std::vector<std::array<uint8_t, 3>>& palette) {
  std::string png = "\x89PNG\r\n\x1a\n";
  std::string ihdr;
  put_be32(ihdr, static_cast<uint32_t>(width));
  put_be32(ihdr, static_cast<uint32_t>(height));
  ihdr += std::string("\x08\x03\x00\x00\x00", 5);   // 8 bits, indexed colour, deflate, no filter, no interlace
  chunk(png, "IHDR", ihdr);
  std::string plte;
  for (const auto& c : palette) plte.append(reinterpret_cast<const char*>(c.data()), 3);
  chunk(png, "PLTE", plte);
  std::string raw;
  raw.reserve(static_cast<size_t>(height) * (width + 1));
  for (int y = 0; y < height; ++y) {
    raw += '\0';   // filter: none
    raw.append(reinterpret_cast<const char*>(pixels.data()) + static_cast<size_t>(y) * width, static_cast<size_t>(width));
  }
  chunk(png, "IDAT", zlib_stored(raw));
  chunk(png, "IEND", "");
  return png;
}

Status write_step_chart_png(const std::string& path, const std::vector<ChartSeries>& series, const std::string& x_unit,
                            const std::string& y_unit) {
  constexpr int W = 900, H = 480, L = 80, R = 120, T = 20, B = 60;
  // 0 white, 1 black, 2 grid grey, 3.. series colours.
  const std::vector<std::array<uint8_t, 3>> palette = {
      {255, 255, 255}, {0, 0, 0},     {220, 220, 220}, {31, 119, 180}, {255, 127, 14}, {44, 160, 44},
      {214, 39, 40},   {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127}, {188, 189, 34},
      {23, 190, 207}};
  Canvas cv(W, H);
  double x_max = 0, y_max = 1;
  for (const ChartSeries& s : series) {
    for (const auto& [x, y] : s.points) {
      x_max = std::max(x_max, x);
      y_max = std::max(y_max, y);
    }
  }
  if (x_max <= 0) x_max = 1;
  const double x_step = nice_step(x_max, 8), y_step = nice_step(y_max, 6);
  x_max = std::ceil(x_max / x_step) * x_step;
  y_max = std::ceil(y_max / y_step) * y_step;
  auto px = [&](double x) { return L + static_cast<int>(std::lround(x / x_max * (W - L - R))); };
  auto py = [&](double y) { return H - B - static_cast<int>(std::lround(y / y_max * (H - T - B))); };
  for (double y = 0; y <= y_max + 1e-9; y += y_step) {
    cv.rect(L, py(y), W - R, py(y), 2);
    const std::string t = number(y) + y_unit;
    cv.text(L - 8 - 12 * static_cast<int>(t.size()), py(y) - 7, t, 1);
  }
  for (double x = 0; x <= x_max + 1e-9; x += x_step) {
    cv.rect(px(x), T, px(x), H - B, 2);
    const std::string t = number(x);
    cv.text(px(x) - 6 * static_cast<int>(t.size()), H - B + 8, t, 1);
  }
  cv.text((L + W - R) / 2 - 18, H - 24, x_unit, 1);
  cv.rect(L, H - B, W - R, H - B, 1);
  cv.rect(L, T, L, H - B, 1);
  cv.rect(L, py(1.0), W - R, py(1.0), 1);   // 1x: PyTorch's own speed
  for (size_t i = 0; i < series.size(); ++i) {
    const auto colour = static_cast<uint8_t>(3 + i % 10);
    const auto& pts = series[i].points;
    for (size_t k = 0; k < pts.size(); ++k) {
      const int x0 = px(pts[k].first), y0 = py(pts[k].second);
      const int x1 = k + 1 < pts.size() ? px(pts[k + 1].first) : px(pts[k].first);
      cv.rect(x0, y0 - 1, x1, y0, colour);   // best so far: a step
      if (k + 1 < pts.size()) cv.rect(x1 - 1, y0, x1, py(pts[k + 1].second), colour);
    }
    const int ly = T + 10 + 22 * static_cast<int>(i);
    cv.rect(W - R + 14, ly, W - R + 30, ly + 12, colour);
    cv.text(W - R + 38, ly, series[i].label, 1);
  }
  const std::string png = encode_indexed_png(W, H, cv.px, palette);
  std::remove((path + ".tmp").c_str());
  return file_io::write_new_file(path + ".tmp", png).ok() && std::rename((path + ".tmp").c_str(), path.c_str()) == 0
             ? Status::ok_status()
             : unavailable("cannot write " + path);
}

}  // namespace kforge
