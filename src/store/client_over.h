// A StoreClient over a connection that is already open and past its handshake (for the fuzz
// target that plays a hostile server, and for StoreClient::connect itself).
#pragma once

#include <memory>
#include <string>

#include "dtrain/store.h"
#include "store/socket.h"

namespace dtrain::store {

// `where` names the server in error messages ("host:port"). REQUIRES: protocol is v1 or v2.
std::unique_ptr<StoreClient> client_over(net::Socket socket, std::string where,
                                         const StoreClient::Options& options,
                                         StoreClient::Options::Protocol protocol);

}  // namespace dtrain::store
