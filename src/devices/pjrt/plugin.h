// A PJRT plugin (XLA's plugin C API, pjrt_c_api.h) loaded with dlopen, and one client of it: the
// calls the PJRT device needs, each checked, each error one "[device] ..." line naming the plugin.
// The same code drives XLA's CPU plugin, libtpu and the GPU plugins: they differ only in the path.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

struct PJRT_Api;
struct PJRT_Client;
struct PJRT_Device;
struct PJRT_Buffer;
struct PJRT_Event;
struct PJRT_LoadedExecutable;
struct PJRT_Error;

namespace kiln::pjrt {

// A device buffer of the client (destroyed with its last reference).
using DeviceBuffer = std::shared_ptr<PJRT_Buffer>;
// Something the device will finish (a copy, an execution): await() blocks until it has.
using Event = std::shared_ptr<PJRT_Event>;

struct Executable;

// Loads the plugin at `path` (dlopen, GetPjrtApi, the API version checks, PJRT_Plugin_Initialize)
// and returns its API table; `library` receives the handle, kept for the process. Throws
// "[device] the PJRT plugin <path> ..." as Client does.
const PJRT_Api* open_plugin(const std::string& path, void** library);
// CompileOptionsProto{executable_build_options{num_replicas: replicas, num_partitions: 1}},
// serialized: the same program on `replicas` devices. (Empty options abort inside XLA.) With
// `first_device` >= 0 they also assign replica r to device first_device + r (a device_assignment);
// without one XLA picks devices 0..replicas-1.
std::string compile_options(int replicas, int first_device = -1);
// The text of `error` on one line; destroys it.
std::string error_text(const PJRT_Api* api, PJRT_Error* error);

class Client {
 public:
  // Loads the plugin at `path` and starts a client: throws "[device] the PJRT plugin <path> ..."
  // when the file is missing, is no PJRT plugin, has an incompatible API or fails to start.
  // `cpu_devices` > 0 asks XLA's CPU plugin for that many devices (its create option
  // cpu_device_count; the plugin's own default is 4); other plugins are given no options.
  explicit Client(const std::string& path, int cpu_devices = 0);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& path() const { return path_; }
  std::string platform_name() const;     // "cpu", "tpu", "cuda", ...
  std::string platform_version() const;  // the plugin's own version string
  std::string api_version() const;       // "0.81": the C API the plugin serves
  int device_count() const { return int(devices_.size()); }

  // Compiles StableHLO (MLIR text) for device `device`, or with `replicas` > 1 for devices
  // device..device+replicas-1, one replica each (the same program on each device's own arguments,
  // joined by its collectives). Throws "[pjrt] compiling <name>: ..." with XLA's message.
  std::shared_ptr<Executable> compile(const std::string& name, const std::string& mlir, int device,
                                      int replicas = 1) const;
  // The executable's serialized form (what the on-disk cache stores) and its reverse.
  std::string serialize(const Executable& exe) const;
  std::shared_ptr<Executable> deserialize(const std::string& name, const std::string& bytes) const;

  // Runs `exe` on its device with `args` (one per program argument; an argument listed in
  // `donated` may be reused for an output). Returns its outputs; their ready events order
  // later work.
  std::vector<DeviceBuffer> execute(const Executable& exe, const std::vector<PJRT_Buffer*>& args,
                                    const std::vector<bool>& donated) const;

  // Runs `exe`, compiled for args.size() replicas: replica r on its device with args[r]. Returns
  // each replica's outputs.
  std::vector<std::vector<DeviceBuffer>> execute_replicas(const Executable& exe,
                                                          const std::vector<std::vector<PJRT_Buffer*>>& args) const;

  // A u8[bytes] buffer on `device` from host memory, which must stay valid and unchanged until
  // the returned event (the plugin may still read it).
  std::pair<DeviceBuffer, Event> upload(const void* data, size_t bytes, int device) const;
  // Copies `bytes` bytes at `offset` of `buffer` to `dst`; done at the returned event.
  Event download(PJRT_Buffer* buffer, void* dst, size_t offset, size_t bytes) const;
  // The event at which `buffer`'s contents are computed.
  Event ready(PJRT_Buffer* buffer) const;
  // Blocks until `event`; throws "[pjrt] <what>: ..." if the work behind it failed.
  void await(const Event& event, const char* what) const;
  bool is_ready(const Event& event) const;

  // The device's memory as the plugin counts it, where it does (GPU and TPU plugins; XLA's CPU
  // plugin keeps none): bytes in use, and the most it may hold (0: no limit given).
  struct DeviceMemory {
    int64_t in_use = 0, limit = 0;
  };
  std::optional<DeviceMemory> memory_stats(int device) const;
  const PJRT_Api* api() const { return api_; }

 private:
  friend struct Executable;
  void check(PJRT_Error* error, const std::string& what) const;
  DeviceBuffer own(PJRT_Buffer* buffer) const;
  // An Executable owning `loaded` (its outputs counted).
  std::shared_ptr<Executable> adopt(PJRT_LoadedExecutable* loaded, const std::string& name) const;
  Event own(PJRT_Event* event) const;
  std::string error_message(PJRT_Error* error) const;
  PJRT_Device* device(int index) const;

  std::string path_;
  void* library_ = nullptr;
  const PJRT_Api* api_ = nullptr;
  PJRT_Client* client_ = nullptr;
  std::vector<PJRT_Device*> devices_;
};

// A compiled program loaded on one device.
struct Executable {
  const Client* client = nullptr;
  PJRT_LoadedExecutable* loaded = nullptr;
  std::string name;
  size_t outputs = 0;
  ~Executable();
};

}  // namespace kiln::pjrt
