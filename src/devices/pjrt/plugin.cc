// The PJRT C API calls of the PJRT device. Every argument struct carries its struct_size (the
// header's *_STRUCT_SIZE), which is how plugins of other API minor versions read it; the API
// table itself is checked to reach the last function used here.
#include "devices/pjrt/plugin.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>

#include <pjrt_c_api.h>

#include "core/error.h"
#include "devices/pjrt/c_api_args.h"

namespace kiln::pjrt {

const PJRT_Api* open_plugin(const std::string& path, void** library) {
  // A bare file name is looked up on the loader's path (libtpu.so); a path must be a file.
  struct stat st {};
  KILN_CHECK(!path.empty() && (path.find('/') == std::string::npos ||
                               (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode))),
             "device", "the PJRT plugin ", path.empty() ? std::string("path") : path,
             " does not exist (set --pjrt-plugin or KILN_PJRT_PLUGIN to a plugin .so; scripts/install-deps.sh ",
             "installs XLA's CPU plugin and libtpu)");
  // XLA's plugins log through TSL: its INFO lines (the CPU plugin announces its device count) would
  // be stray stderr lines; warnings and errors still show. A value the user set is kept.
  ::setenv("TF_CPP_MIN_LOG_LEVEL", "1", /*overwrite=*/0);
  *library = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!*library) fail("device", "the PJRT plugin ", path, " could not be loaded: ", ::dlerror());
  using GetApi = const PJRT_Api* (*)();
  auto get = reinterpret_cast<GetApi>(::dlsym(*library, "GetPjrtApi"));
  KILN_CHECK(get != nullptr, "device", "the PJRT plugin ", path, " has no GetPjrtApi: it is not a PJRT plugin");
  const PJRT_Api* api = get();
  KILN_CHECK(api != nullptr, "device", "the PJRT plugin ", path, " returned no API table");
  const int major = api->pjrt_api_version.major_version, minor = api->pjrt_api_version.minor_version;
  KILN_CHECK(major == PJRT_API_MAJOR, "device", "the PJRT plugin ", path, " serves PJRT C API ", major, ".", minor,
             ", kiln speaks ", PJRT_API_MAJOR, ".x");
  // A plugin older than the header has a shorter table: it must reach every function used here.
  const size_t needed = offsetof(PJRT_Api, PJRT_Buffer_CopyRawToHost) + sizeof(void*);
  KILN_CHECK(api->struct_size >= needed, "device", "the PJRT plugin ", path, " serves PJRT C API ", major, ".",
             minor, ", too old: kiln needs the functions up to PJRT_Buffer_CopyRawToHost");
  if (api->PJRT_Plugin_Initialize) {
    auto init = KILN_PJRT_ARGS(PJRT_Plugin_Initialize_Args);
    if (PJRT_Error* e = api->PJRT_Plugin_Initialize(&init))
      fail("pjrt", "starting the plugin failed in the plugin ", path, ": ", error_text(api, e));
  }
  return api;
}

std::string compile_options(int replicas, int first_device) {
  KILN_CHECK(replicas >= 1 && replicas < 128 && first_device < 128 && first_device + replicas <= 128, "pjrt",
             "a program for ", replicas, " replicas from device ", first_device);
  // Protobuf wire format by hand (every number here fits one varint byte): a field is its number
  // << 3 | wire type (0 varint, 2 length-delimited), then its value or length and bytes.
  const auto message = [](int field, const std::string& body) {
    return std::string{char(field << 3 | 2), char(body.size())} + body;
  };
  std::string build{0x20, char(replicas), 0x28, 0x01};  // num_replicas (4), num_partitions (5)
  if (first_device >= 0) {
    std::string ids;  // ComputationDevice.replica_device_ids (1), packed
    for (int r = 0; r < replicas; ++r) ids += char(first_device + r);
    // DeviceAssignmentProto: replica_count (1), computation_count (2), computation_devices (3).
    const std::string assignment = std::string{0x08, char(replicas), 0x10, 0x01} + message(3, message(1, ids));
    build += message(9, assignment);  // ExecutableBuildOptionsProto.device_assignment (9)
  }
  return message(3, build);  // CompileOptionsProto.executable_build_options (3)
}

std::string error_text(const PJRT_Api* api, PJRT_Error* error) {
  auto msg = KILN_PJRT_ARGS(PJRT_Error_Message_Args);
  msg.error = error;
  api->PJRT_Error_Message(&msg);
  std::string text(msg.message, msg.message_size);
  auto destroy = KILN_PJRT_ARGS(PJRT_Error_Destroy_Args);
  destroy.error = error;
  api->PJRT_Error_Destroy(&destroy);
  for (char& c : text)
    if (c == '\n') c = ' ';
  return text;
}

Client::Client(const std::string& path, int cpu_devices) : path_(path) {
  api_ = open_plugin(path, &library_);
  auto create = KILN_PJRT_ARGS(PJRT_Client_Create_Args);
  static const char kCpuDeviceCount[] = "cpu_device_count";
  auto count = KILN_PJRT_ARGS(PJRT_NamedValue);
  count.name = kCpuDeviceCount;
  count.name_size = sizeof(kCpuDeviceCount) - 1;
  count.type = PJRT_NamedValue_kInt64;
  count.int64_value = cpu_devices;
  count.value_size = 1;
  if (cpu_devices > 0) {
    create.create_options = &count;
    create.num_options = 1;
  }
  check(api_->PJRT_Client_Create(&create), "creating a client");
  client_ = create.client;
  auto devs = KILN_PJRT_ARGS(PJRT_Client_AddressableDevices_Args);
  devs.client = client_;
  check(api_->PJRT_Client_AddressableDevices(&devs), "listing its devices");
  devices_.assign(devs.addressable_devices, devs.addressable_devices + devs.num_addressable_devices);
}

Client::~Client() {
  // Plugins tear down their threads at exit on their own; the client outlives every buffer
  // (device runtimes live for the process), so it is left to the process's end.
}

std::string Client::error_message(PJRT_Error* error) const { return error_text(api_, error); }

void Client::check(PJRT_Error* error, const std::string& what) const {
  if (error) fail("pjrt", what, " failed in the plugin ", path_, ": ", error_message(error));
}

PJRT_Device* Client::device(int index) const {
  KILN_CHECK(index >= 0 && index < int(devices_.size()), "device", "pjrt:", index, " is not available: the plugin ",
             path_, " has ", devices_.size(), " device", devices_.size() == 1 ? "" : "s");
  return devices_[size_t(index)];
}

std::string Client::platform_name() const {
  auto a = KILN_PJRT_ARGS(PJRT_Client_PlatformName_Args);
  a.client = client_;
  check(api_->PJRT_Client_PlatformName(&a), "asking the platform name");
  return std::string(a.platform_name, a.platform_name_size);
}

std::string Client::platform_version() const {
  auto a = KILN_PJRT_ARGS(PJRT_Client_PlatformVersion_Args);
  a.client = client_;
  check(api_->PJRT_Client_PlatformVersion(&a), "asking the platform version");
  return std::string(a.platform_version, a.platform_version_size);
}

std::string Client::api_version() const {
  return std::to_string(api_->pjrt_api_version.major_version) + "." +
         std::to_string(api_->pjrt_api_version.minor_version);
}

Executable::~Executable() {
  if (!loaded) return;
  auto a = KILN_PJRT_ARGS(PJRT_LoadedExecutable_Destroy_Args);
  a.executable = loaded;
  client->api()->PJRT_LoadedExecutable_Destroy(&a);
}

std::shared_ptr<Executable> Client::adopt(PJRT_LoadedExecutable* loaded, const std::string& name) const {
  auto exe = std::make_shared<Executable>();
  exe->client = this;
  exe->loaded = loaded;
  exe->name = name;
  auto get = KILN_PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  get.loaded_executable = loaded;
  check(api_->PJRT_LoadedExecutable_GetExecutable(&get), "reading a compiled program");
  auto outs = KILN_PJRT_ARGS(PJRT_Executable_NumOutputs_Args);
  outs.executable = get.executable;
  PJRT_Error* e = api_->PJRT_Executable_NumOutputs(&outs);
  destroy_executable(api_, get.executable);
  check(e, "counting a program's outputs");
  exe->outputs = outs.num_outputs;
  return exe;
}

std::shared_ptr<Executable> Client::compile(const std::string& name, const std::string& mlir, int dev,
                                            int replicas) const {
  device(dev);
  device(dev + replicas - 1);  // every replica's device exists
  PJRT_Program program = mlir_program(mlir);
  auto a = KILN_PJRT_ARGS(PJRT_Client_Compile_Args);
  a.client = client_;
  a.program = &program;
  const std::string options = compile_options(replicas, dev);
  a.compile_options = options.data();
  a.compile_options_size = options.size();
  if (PJRT_Error* e = api_->PJRT_Client_Compile(&a)) fail("pjrt", "compiling ", name, ": ", error_message(e));
  return adopt(a.executable, name);
}

std::string Client::serialize(const Executable& exe) const {
  auto get = KILN_PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  get.loaded_executable = exe.loaded;
  check(api_->PJRT_LoadedExecutable_GetExecutable(&get), "reading a compiled program");
  auto a = KILN_PJRT_ARGS(PJRT_Executable_Serialize_Args);
  a.executable = get.executable;
  PJRT_Error* e = api_->PJRT_Executable_Serialize(&a);
  std::string bytes;
  if (!e) bytes.assign(a.serialized_bytes, a.serialized_bytes_size);
  if (!e && a.serialized_executable_deleter) a.serialized_executable_deleter(a.serialized_executable);
  destroy_executable(api_, get.executable);
  check(e, "serializing " + exe.name);
  return bytes;
}

std::shared_ptr<Executable> Client::deserialize(const std::string& name, const std::string& bytes) const {
  auto a = KILN_PJRT_ARGS(PJRT_Executable_DeserializeAndLoad_Args);
  a.client = client_;
  a.serialized_executable = bytes.data();
  a.serialized_executable_size = bytes.size();
  check(api_->PJRT_Executable_DeserializeAndLoad(&a), "loading the cached program " + name);
  return adopt(a.loaded_executable, name);
}

DeviceBuffer Client::own(PJRT_Buffer* buffer) const {
  const PJRT_Api* api = api_;
  return DeviceBuffer(buffer, [api](PJRT_Buffer* b) {
    auto a = KILN_PJRT_ARGS(PJRT_Buffer_Destroy_Args);
    a.buffer = b;
    api->PJRT_Buffer_Destroy(&a);
  });
}

Event Client::own(PJRT_Event* event) const {
  if (!event) return nullptr;
  const PJRT_Api* api = api_;
  return Event(event, [api](PJRT_Event* e) {
    auto a = KILN_PJRT_ARGS(PJRT_Event_Destroy_Args);
    a.event = e;
    api->PJRT_Event_Destroy(&a);
  });
}

std::vector<DeviceBuffer> Client::execute(const Executable& exe, const std::vector<PJRT_Buffer*>& args,
                                          const std::vector<bool>& donated) const {
  std::vector<int64_t> kept;
  for (size_t i = 0; i < args.size(); ++i)
    if (i >= donated.size() || !donated[i]) kept.push_back(int64_t(i));
  auto options = KILN_PJRT_ARGS(PJRT_ExecuteOptions);
  options.non_donatable_input_indices = kept.data();
  options.num_non_donatable_input_indices = kept.size();
  std::vector<PJRT_Buffer*> outputs(exe.outputs, nullptr);
  PJRT_Buffer* const* arg_list = args.data();
  PJRT_Buffer** output_list = outputs.data();
  auto a = KILN_PJRT_ARGS(PJRT_LoadedExecutable_Execute_Args);
  a.executable = exe.loaded;
  a.options = &options;
  a.argument_lists = &arg_list;
  a.num_devices = 1;
  a.num_args = args.size();
  a.output_lists = &output_list;
  check(api_->PJRT_LoadedExecutable_Execute(&a), "running " + exe.name);
  std::vector<DeviceBuffer> owned;
  owned.reserve(outputs.size());
  for (PJRT_Buffer* b : outputs) owned.push_back(own(b));
  return owned;
}

std::vector<std::vector<DeviceBuffer>> Client::execute_replicas(
    const Executable& exe, const std::vector<std::vector<PJRT_Buffer*>>& args) const {
  const size_t n = args.size();
  auto options = KILN_PJRT_ARGS(PJRT_ExecuteOptions);
  std::vector<int64_t> kept(args.empty() ? 0 : args[0].size());
  for (size_t i = 0; i < kept.size(); ++i) kept[i] = int64_t(i);
  options.non_donatable_input_indices = kept.data();
  options.num_non_donatable_input_indices = kept.size();
  std::vector<std::vector<PJRT_Buffer*>> outputs(n, std::vector<PJRT_Buffer*>(exe.outputs, nullptr));
  std::vector<PJRT_Buffer* const*> arg_lists;
  std::vector<PJRT_Buffer**> output_lists;
  for (size_t r = 0; r < n; ++r) {
    KILN_CHECK(args[r].size() == kept.size(), "pjrt", exe.name, ": replica ", r, " has ", args[r].size(),
               " arguments, replica 0 ", kept.size());
    arg_lists.push_back(args[r].data());
    output_lists.push_back(outputs[r].data());
  }
  auto a = KILN_PJRT_ARGS(PJRT_LoadedExecutable_Execute_Args);
  a.executable = exe.loaded;
  a.options = &options;
  a.argument_lists = arg_lists.data();
  a.num_devices = n;
  a.num_args = kept.size();
  a.output_lists = output_lists.data();
  check(api_->PJRT_LoadedExecutable_Execute(&a), "running " + exe.name + " on " + std::to_string(n) + " replicas");
  std::vector<std::vector<DeviceBuffer>> owned(n);
  for (size_t r = 0; r < n; ++r)
    for (PJRT_Buffer* b : outputs[r]) owned[r].push_back(own(b));
  return owned;
}

std::pair<DeviceBuffer, Event> Client::upload(const void* data, size_t bytes, int dev) const {
  const int64_t dims[1] = {int64_t(bytes)};
  auto a = KILN_PJRT_ARGS(PJRT_Client_BufferFromHostBuffer_Args);
  a.client = client_;
  a.data = data;
  a.type = PJRT_Buffer_Type_U8;
  a.dims = dims;
  a.num_dims = 1;
  a.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
  a.device = device(dev);
  check(api_->PJRT_Client_BufferFromHostBuffer(&a), "copying " + std::to_string(bytes) + " bytes to the device");
  return {own(a.buffer), own(a.done_with_host_buffer)};
}

Event Client::download(PJRT_Buffer* buffer, void* dst, size_t offset, size_t bytes) const {
  auto a = KILN_PJRT_ARGS(PJRT_Buffer_CopyRawToHost_Args);
  a.buffer = buffer;
  a.dst = dst;
  a.offset = int64_t(offset);
  a.transfer_size = int64_t(bytes);
  PJRT_Error* e = api_->PJRT_Buffer_CopyRawToHost(&a);
  if (e) {
    // Plugins without raw copies (CopyRawToHost is optional): the whole buffer, then the range.
    error_message(e);
    KILN_CHECK(offset == 0, "pjrt", "the plugin ", path_, " copies only whole buffers to the host");
    auto t = KILN_PJRT_ARGS(PJRT_Buffer_ToHostBuffer_Args);
    t.src = buffer;
    t.dst = dst;
    t.dst_size = bytes;
    check(api_->PJRT_Buffer_ToHostBuffer(&t), "copying " + std::to_string(bytes) + " bytes to the host");
    return own(t.event);
  }
  return own(a.event);
}

Event Client::ready(PJRT_Buffer* buffer) const {
  auto a = KILN_PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args);
  a.buffer = buffer;
  check(api_->PJRT_Buffer_ReadyEvent(&a), "asking when a buffer is ready");
  return own(a.event);
}

void Client::await(const Event& event, const char* what) const {
  if (!event) return;
  auto a = KILN_PJRT_ARGS(PJRT_Event_Await_Args);
  a.event = event.get();
  check(api_->PJRT_Event_Await(&a), what);
}

bool Client::is_ready(const Event& event) const {
  if (!event) return true;
  auto a = KILN_PJRT_ARGS(PJRT_Event_IsReady_Args);
  a.event = event.get();
  check(api_->PJRT_Event_IsReady(&a), "polling an event");
  return a.is_ready;
}

std::optional<Client::DeviceMemory> Client::memory_stats(int dev) const {
  auto a = KILN_PJRT_ARGS(PJRT_Device_MemoryStats_Args);
  a.device = device(dev);
  if (PJRT_Error* e = api_->PJRT_Device_MemoryStats(&a)) {
    error_message(e);  // unimplemented on XLA's CPU plugin
    return std::nullopt;
  }
  return DeviceMemory{a.bytes_in_use, a.bytes_limit_is_set ? a.bytes_limit : 0};
}

}  // namespace kiln::pjrt
