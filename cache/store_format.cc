// The store's file formats (Note [Cache layout] in store.cc): the checksummed frame, the
// FlatBuffers manifest and the msgpack state record.
#include "cache/store_internal.h"

namespace kforge::store_detail {

std::string frame(std::string_view magic, uint32_t version, std::string_view payload) {
  std::string out;
  out.reserve(kFrameHeaderBytes + payload.size());
  out += magic;
  put_u32(out, version);
  put_u32(out, 0);
  put_u64(out, payload.size());
  std::array<uint8_t, kSha256Bytes> h{};
  crypto_hash_sha256(h.data(), reinterpret_cast<const unsigned char*>(payload.data()), payload.size());
  out.append(reinterpret_cast<const char*>(h.data()), h.size());
  out += payload;
  return out;
}

// The payload of a framed file, or what is wrong with it (without the file's name: callers add it).
StatusOr<std::string_view> unframe(std::string_view file, std::string_view magic, uint32_t version,
                                   size_t max_payload) {
  if (file.size() < kFrameHeaderBytes) {
    return invalid_argument("truncated (" + std::to_string(file.size()) + " bytes, shorter than the " +
                            std::to_string(kFrameHeaderBytes) + "-byte header)");
  }
  if (file.substr(0, 8) != magic) return invalid_argument("bad magic '" + excerpt(file.substr(0, 8)) + "'");
  const auto v = static_cast<uint32_t>(get_le(file, 8, 4));
  if (v != version) {
    return invalid_argument("format version " + std::to_string(v) + ", this kforge reads " + std::to_string(version));
  }
  if (get_le(file, 12, 4) != 0) return invalid_argument("reserved header field is not zero");
  const uint64_t len = get_le(file, 16, 8);
  if (len > max_payload) {
    return invalid_argument("payload length " + std::to_string(len) + " over the limit of " +
                            std::to_string(max_payload));
  }
  const uint64_t expected = kFrameHeaderBytes + len;
  if (file.size() < expected) {
    return invalid_argument("truncated (" + std::to_string(file.size()) + " of " + std::to_string(expected) +
                            " bytes)");
  }
  if (file.size() > expected) {
    return invalid_argument(std::to_string(file.size() - expected) + " unexpected bytes after the " +
                            std::to_string(expected) + "-byte record");
  }
  std::string_view payload = file.substr(kFrameHeaderBytes);
  std::array<uint8_t, kSha256Bytes> h{};
  crypto_hash_sha256(h.data(), reinterpret_cast<const unsigned char*>(payload.data()), payload.size());
  if (std::memcmp(h.data(), file.data() + 24, kSha256Bytes) != 0) {
    return invalid_argument("checksum mismatch (SHA-256 of the content differs from the header's)");
  }
  return payload;
}

// ---- manifests ----------------------------------------------------------------------------------------

Status check_blob_ref(const std::string& field, std::string_view name, std::string_view sha, uint64_t size) {
  if (name.empty() || name.size() > kMaxBlobNameBytes) {
    return invalid_argument(field + ".name: must be 1 to " + std::to_string(kMaxBlobNameBytes) + " bytes");
  }
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
          c == '.')) {
      return invalid_argument(field + ".name: '" + excerpt(name) + "' has characters outside [A-Za-z0-9_.-]");
    }
  }
  // The hash becomes a path under blobs/: anything but 64 lowercase hex digits is refused.
  if (sha.size() != 64 || !is_lower_hex(sha)) {
    return invalid_argument(field + ".sha256: '" + excerpt(sha) + "' is not 64 lowercase hex digits");
  }
  if (size > kMaxBlobBytes) {
    return invalid_argument(field + ".size: " + std::to_string(size) + " over the limit of " +
                            std::to_string(kMaxBlobBytes));
  }
  return Status();
}

std::string encode_manifest(const CacheEntry& e, const std::vector<BlobRef>& refs) {
  flatbuffers::FlatBufferBuilder b(1024 + e.spec.source.size());
  const std::string sig = e.signature.encode();
  const std::string env = e.environment.encode();
  const std::string spec = e.spec.encode();
  auto bytes = [&](const std::string& s) {
    return b.CreateVector(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  auto sig_off = bytes(sig);
  auto env_off = bytes(env);
  auto spec_off = bytes(spec);
  std::vector<flatbuffers::Offset<fb::BlobRef>> blob_offs;
  for (const BlobRef& r : refs) {
    auto name = b.CreateString(r.name);
    auto sha = b.CreateString(r.sha256_hex);
    blob_offs.push_back(fb::CreateBlobRef(b, name, sha, r.size));
  }
  auto blobs = b.CreateVector(blob_offs);
  const VerificationReport& v = e.verification;
  auto ver = fb::CreateVerificationReport(b, v.trials, v.max_abs_error, v.rel_error, v.torch_max_abs_error,
                                          v.torch_rel_error, v.passed, b.CreateString(v.details));
  const Timings& t = e.timings;
  auto tim = fb::CreateTimings(b, t.baseline_ns, t.candidate_ns, t.spread, t.runs);
  const Provenance& p = e.provenance;
  auto prov = fb::CreateProvenance(b, b.CreateString(p.proposer), b.CreateString(p.search_id),
                                   b.CreateString(p.kforge_version), p.created_unix_ms, b.CreateString(p.host));
  b.Finish(fb::CreateManifest(b, kManifestFormatVersion, sig_off, env_off, spec_off, blobs, ver, tim, prov),
           fb::ManifestIdentifier());
  return frame(kManifestMagic, kManifestFormatVersion,
               std::string_view(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize()));
}

std::string_view view(const flatbuffers::Vector<uint8_t>* v) {
  return {reinterpret_cast<const char*>(v->data()), v->size()};
}
std::string str(const flatbuffers::String* s) { return s == nullptr ? std::string() : s->str(); }

// Everything but the status; errors name the part that is wrong, not the file.
StatusOr<StoredEntry> parse_manifest_impl(std::string_view file) {
  KFORGE_ASSIGN_OR_RETURN(std::string_view payload,
                          unframe(file, kManifestMagic, kManifestFormatVersion, kMaxManifestPayload));
  // FlatBuffers reads scalars in place, so the buffer must be 8-byte aligned whatever the caller's.
  std::vector<uint64_t> aligned((payload.size() + 7) / 8);
  std::memcpy(aligned.data(), payload.data(), payload.size());
  const auto* buf = reinterpret_cast<const uint8_t*>(aligned.data());
  flatbuffers::Verifier::Options opts;
  opts.max_depth = 8;
  opts.max_tables = 4 * kMaxBlobs + 16;
  flatbuffers::Verifier verifier(buf, payload.size(), opts);
  if (!fb::VerifyManifestBuffer(verifier)) return invalid_argument("FlatBuffers verifier rejected the manifest");
  const fb::Manifest* m = fb::GetManifest(buf);
  if (m->format_version() != kManifestFormatVersion) {
    return invalid_argument("manifest format version " + std::to_string(m->format_version()) + ", expected " +
                            std::to_string(kManifestFormatVersion));
  }
  StoredEntry e;
  auto sig = OpSignature::decode(view(m->signature()));
  if (!sig.ok()) return invalid_argument("signature: " + sig.status().message());
  e.signature = std::move(sig).value();
  auto env = Environment::decode(view(m->environment()));
  if (!env.ok()) return invalid_argument("environment: " + env.status().message());
  e.environment = std::move(env).value();
  auto spec = KernelSpec::decode(view(m->kernel_spec()));
  if (!spec.ok()) return invalid_argument("kernel spec: " + spec.status().message());
  e.spec = std::move(spec).value();
  if (m->blobs() != nullptr) {
    if (m->blobs()->size() > kMaxBlobs) {
      return invalid_argument(std::to_string(m->blobs()->size()) + " blobs, over the limit of " +
                              std::to_string(kMaxBlobs));
    }
    for (flatbuffers::uoffset_t i = 0; i < m->blobs()->size(); ++i) {
      const fb::BlobRef* r = m->blobs()->Get(i);
      BlobRef ref{r->name()->str(), r->sha256()->str(), r->size()};
      const std::string field = "blobs[" + std::to_string(i) + "]";
      KFORGE_RETURN_IF_ERROR(check_blob_ref(field, ref.name, ref.sha256_hex, ref.size));
      for (const BlobRef& prev : e.blobs) {
        if (prev.name == ref.name) return invalid_argument(field + ".name: duplicate name '" + ref.name + "'");
      }
      e.blobs.push_back(std::move(ref));
    }
  }
  const fb::VerificationReport* v = m->verification();
  e.verification = {v->trials(),          v->max_abs_error(), v->rel_error(),   v->torch_max_abs_error(),
                    v->torch_rel_error(), v->passed(),        str(v->details())};
  const fb::Timings* t = m->timings();
  e.timings = {t->baseline_ns(), t->candidate_ns(), t->spread(), t->runs()};
  const fb::Provenance* p = m->provenance();
  e.provenance = {str(p->proposer()), str(p->search_id()), str(p->kforge_version()), p->created_unix_ms(),
                  str(p->host())};
  e.key = entry_key(e.signature, e.environment);
  e.manifest_bytes = file.size();
  return e;
}

// ---- state files -----------------------------------------------------------------------------------

std::string encode_state(const EntryKey& key, const EntryStatus& s) {
  msgpack::sbuffer buf;
  codec::Packer pk(buf);
  pk.pack_array(6);
  pk.pack_uint32(kStateFormatVersion);
  pk.pack(key.hex());
  pk.pack_uint8(static_cast<uint8_t>(s.state));
  pk.pack(s.reason);
  pk.pack_int64(s.changed_unix_ms);
  s.pinned ? pk.pack_true() : pk.pack_false();
  return frame(kStateMagic, kStateFormatVersion, std::string_view(buf.data(), buf.size()));
}

StatusOr<EntryStatus> decode_state(std::string_view file, const EntryKey& key) {
  KFORGE_ASSIGN_OR_RETURN(std::string_view payload, unframe(file, kStateMagic, kStateFormatVersion, kMaxStatePayload));
  codec::Limits limits;
  limits.max_bytes = kMaxStatePayload;
  limits.max_str = kMaxReasonBytes;
  KFORGE_ASSIGN_OR_RETURN(msgpack::object_handle oh, codec::parse(payload, limits));
  codec::Reader r(oh.get(), "state");
  KFORGE_RETURN_IF_ERROR(r.expect_array(6));
  KFORGE_ASSIGN_OR_RETURN(int64_t version, r.field(0, "version").i64());
  if (version != kStateFormatVersion) {
    return r.field(0, "version").error("unsupported version " + std::to_string(version));
  }
  KFORGE_ASSIGN_OR_RETURN(std::string owner, r.field(1, "key").str(32));
  if (owner != key.hex()) return r.field(1, "key").error("belongs to entry " + excerpt(owner));
  EntryStatus s;
  KFORGE_ASSIGN_OR_RETURN(int64_t state, r.field(2, "state").i64_in(0, 2));
  s.state = static_cast<EntryState>(state);
  KFORGE_ASSIGN_OR_RETURN(s.reason, r.field(3, "reason").str(kMaxReasonBytes));
  KFORGE_ASSIGN_OR_RETURN(s.changed_unix_ms, r.field(4, "changed_unix_ms").i64());
  KFORGE_ASSIGN_OR_RETURN(s.pinned, r.field(5, "pinned").boolean());
  return s;
}

}  // namespace kforge::store_detail
