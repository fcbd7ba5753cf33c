// Constructors of the backends this build has (communicator.cpp picks one); private to engine/dist.
#pragma once

#include <memory>

#include "communicator.h"

namespace kv::dist::detail {

#ifdef KVLAB_HAVE_MPI
std::unique_ptr<Communicator> make_mpi_communicator(const DistOptions& opt);
#endif
#ifdef KVLAB_HAVE_NCCL
// Loads the NCCL plugin (nccl_communicator.cpp), which bootstraps over `mpi` (rank 0's unique
// id, broadcast) and keeps it for the small collectives.
std::unique_ptr<Communicator> load_nccl_communicator(const DistOptions& opt, std::unique_ptr<Communicator> mpi);
#endif

}  // namespace kv::dist::detail
