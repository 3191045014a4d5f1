// ddl_torch._C: a c10d::Backend whose operations run in Python.
//
// torch.distributed wraps every backend in a c10d::ProcessGroup and takes the group's name
// (FSDP2, DTensor, DeviceMesh, the functional collectives resolve groups by name) from the
// Backend registered in it. A Python `dist.ProcessGroup` subclass has no Backend, so those
// fail with "ProcessGroup name not set"; torch's Python `Backend` class has no trampoline,
// so a Backend cannot be written in Python. This file is the smallest C++ piece that
// closes the gap: ForwardingBackend is a real c10d::Backend (torch registers it, names it,
// sequences it) and forwards each operation, with the GIL held, to a method of the same
// name on a Python object: ddl_core.torch.backend's implementation, which queues the work
// on libddl. The Python Work each returns is held by a PyWorkRef for as long as torch
// holds the Work (a Python Work subclass loses its overrides once its object is freed).
#include <torch/extension.h>

#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;
using Tensors = std::vector<at::Tensor>;
using TensorLists = std::vector<std::vector<at::Tensor>>;

// Releases a Python reference with the GIL held; never once the interpreter is gone.
void release(py::object& obj) {
  if (Py_IsInitialized()) {
    py::gil_scoped_acquire gil;
    obj = py::object();
  } else {
    obj.release();
  }
}

// The Work handed to torch: the Python Work (a torch.distributed.Work subclass, whose
// wait()/get_future() torch's own trampoline forwards to Python) plus a reference that
// keeps its Python object alive.
class PyWorkRef final : public Work {
 public:
  explicit PyWorkRef(py::object work) : work_(work.cast<WorkPtr>()), py_(std::move(work)) {}
  ~PyWorkRef() override { release(py_); }

  bool wait(std::chrono::milliseconds timeout) override { return work_->wait(timeout); }
  void synchronize() override { work_->wait(kNoTimeout); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return work_->getFuture(); }
  bool isCompleted() override {
    py::gil_scoped_acquire gil;
    return py_.attr("is_completed")().cast<bool>();
  }
  bool isSuccess() const override {
    py::gil_scoped_acquire gil;
    return py_.attr("is_success")().cast<bool>();
  }
  // The Python Work's error (a ddl_core error), as torch's exception_ptr: Work.exception()
  // must not say None for a collective that failed.
  std::exception_ptr exception() const override {
    py::gil_scoped_acquire gil;
    py::object err = py_.attr("exception")();
    if (err.is_none()) return nullptr;
    std::string text = py::str(err);
    return std::make_exception_ptr(std::runtime_error(
        py::str(py::type::handle_of(err).attr("__name__")).cast<std::string>() + ": " + text));
  }
  std::vector<at::Tensor> result() override {
    py::gil_scoped_acquire gil;
    py::object value = py_.attr("result")();
    std::vector<at::Tensor> out;
    if (py::isinstance<py::list>(value)) {
      for (auto item : value) {
        if (THPVariable_Check(item.ptr())) out.push_back(item.cast<at::Tensor>());
      }
    }
    return out;
  }

 private:
  WorkPtr work_;
  py::object py_;
};

class ForwardingBackend final : public c10d::Backend {
 public:
  ForwardingBackend(py::object impl, int rank, int size, std::string name)
      : Backend(rank, size), impl_(std::move(impl)), name_(std::move(name)) {}

  ~ForwardingBackend() override { release(impl_); }

  const std::string getBackendName() const override { return name_; }

  py::object impl() const { return impl_; }

  void setTimeout(std::chrono::milliseconds timeout) override {
    py::gil_scoped_acquire gil;
    impl_.attr("set_timeout")(timeout);
  }

  c10::intrusive_ptr<Work> broadcast(Tensors& tensors,
                                     const c10d::BroadcastOptions& opts) override {
    return forward("broadcast", tensors, opts);
  }
  WorkPtr allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) override {
    return forward("allreduce", tensors, opts);
  }
  WorkPtr allreduce_coalesced(Tensors& tensors,
                              const c10d::AllreduceCoalescedOptions& opts) override {
    return forward("allreduce_coalesced", tensors, static_cast<const c10d::AllreduceOptions&>(opts));
  }
  WorkPtr reduce(Tensors& tensors, const c10d::ReduceOptions& opts) override {
    return forward("reduce", tensors, opts);
  }
  WorkPtr allgather(TensorLists& outputs, Tensors& inputs,
                    const c10d::AllgatherOptions& opts) override {
    return forward("allgather", outputs, inputs, opts);
  }
  WorkPtr _allgather_base(at::Tensor& output, at::Tensor& input,
                          const c10d::AllgatherOptions& opts) override {
    return forward("_allgather_base", output, input, opts);
  }
  WorkPtr allgather_coalesced(TensorLists& outputs, Tensors& inputs,
                              const c10d::AllgatherOptions& opts) override {
    return forward("allgather_coalesced", outputs, inputs, opts);
  }
  WorkPtr allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                          const c10d::AllgatherOptions& opts) override {
    return forward("allgather_into_tensor_coalesced", outputs, inputs, opts);
  }
  WorkPtr gather(TensorLists& outputs, Tensors& inputs,
                 const c10d::GatherOptions& opts) override {
    return forward("gather", outputs, inputs, opts);
  }
  WorkPtr scatter(Tensors& outputs, TensorLists& inputs,
                  const c10d::ScatterOptions& opts) override {
    return forward("scatter", outputs, inputs, opts);
  }
  WorkPtr reduce_scatter(Tensors& outputs, TensorLists& inputs,
                         const c10d::ReduceScatterOptions& opts) override {
    return forward("reduce_scatter", outputs, inputs, opts);
  }
  WorkPtr _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                               const c10d::ReduceScatterOptions& opts) override {
    return forward("_reduce_scatter_base", output, input, opts);
  }
  WorkPtr reduce_scatter_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                          const c10d::ReduceScatterOptions& opts) override {
    return forward("reduce_scatter_tensor_coalesced", outputs, inputs, opts);
  }
  WorkPtr alltoall_base(at::Tensor& output, at::Tensor& input,
                        std::vector<int64_t>& outputSplits, std::vector<int64_t>& inputSplits,
                        const c10d::AllToAllOptions& opts) override {
    return forward("alltoall_base", output, input, outputSplits, inputSplits, opts);
  }
  WorkPtr alltoall(Tensors& outputs, Tensors& inputs,
                   const c10d::AllToAllOptions& opts) override {
    return forward("alltoall", outputs, inputs, opts);
  }
  WorkPtr barrier(const c10d::BarrierOptions& opts) override {
    return forward("barrier", opts);
  }
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override {
    py::gil_scoped_acquire gil;
    impl_.attr("monitored_barrier")(opts.timeout, waitAllRanks);
  }
  WorkPtr send(Tensors& tensors, int dstRank, int tag) override {
    return forward("send", tensors, dstRank, tag);
  }
  WorkPtr recv(Tensors& tensors, int srcRank, int tag) override {
    return forward("recv", tensors, srcRank, tag);
  }
  WorkPtr recvAnysource(Tensors& tensors, int tag) override {
    return forward("recv_anysource", tensors, tag);
  }
  void shutdown() override {
    py::gil_scoped_acquire gil;
    if (py::hasattr(impl_, "shutdown")) impl_.attr("shutdown")();
  }
  void abort() override { shutdown(); }

 private:
  // Calls impl.<method>(args...) and hands its Work to torch. A Python exception
  // propagates as pybind11::error_already_set, which torch's bindings turn back into the
  // original exception (a ddl_core error stays a ddl_core error).
  template <typename... Args>
  WorkPtr forward(const char* method, Args&&... args) {
    py::gil_scoped_acquire gil;
    py::object work = impl_.attr(method)(std::forward<Args>(args)...);
    return c10::make_intrusive<PyWorkRef>(std::move(work));
  }

  py::object impl_;
  std::string name_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "A c10d::Backend that forwards its operations to a Python object (DDL)";
  // The Python type of the result is torch's Backend: torch needs nothing more.
  m.def(
      "make_backend",
      [](py::object impl, int rank, int size, const std::string& name) {
        return c10::intrusive_ptr<c10d::Backend>(
            c10::make_intrusive<ForwardingBackend>(std::move(impl), rank, size, name));
      },
      py::arg("impl"), py::arg("rank"), py::arg("size"), py::arg("name"),
      "A torch c10d Backend of `size` ranks whose operations call impl's methods.");
  m.def(
      "backend_impl",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) -> py::object {
        auto* fwd = dynamic_cast<ForwardingBackend*>(backend.get());
        if (fwd == nullptr) return py::none();
        return fwd->impl();
      },
      py::arg("backend"), "The Python object behind a backend from make_backend, else None.");
}
